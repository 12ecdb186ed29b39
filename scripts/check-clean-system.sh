#!/usr/bin/env bash
# The release wheel on a system that has nothing but Python: a Debian 12
# root filesystem made by debootstrap (--variant=minbase plus python3-venv:
# no compiler, no MPFR, fmt, toml++ or CUDA), entered with chroot.
# There, as a user would:
#   pip install accumcheck-*.whl torch==2.13.0   into a fresh venv
#   ldd of the installed command: only the C library, libm, libstdc++,
#     libgcc_s and the wheel's own libraries (ENV/lib/accumcheck/)
#   accumcheck --version equals accumcheck_torch.__version__
#   --engine device (the emulated executor) runs a scenario; --engine cuda
#     is refused, exit 2, saying why (no driver, no GPU)
#   an example trainer (examples/oracle/train_correct.py) on an exported
#     bundle, certified: PASS
#   pipx install of the wheel puts `accumcheck` on PATH
#
#   sudo bash scripts/check-clean-system.sh [WHEEL]
# WHEEL: default the newest dist/accumcheck-*manylinux*.whl, built by
# scripts/build-wheel.sh when there is none.  Needs root (debootstrap,
# chroot, mount) and the network (Debian's archive, the package index).
# The root is made once and kept as a tarball in
# ${XDG_CACHE_HOME:-~/.cache}/accumcheck/ (ACCUMCHECK_CLEAN_ROOT_CACHE);
# every run unpacks a fresh copy and removes it after.  The Debian mirror
# is the one the host's apt uses (ACCUMCHECK_DEBIAN_MIRROR overrides);
# pip inside the root uses the host's pip configuration (its config file,
# PIP_* variables, and the local folders they name, bound read-only).
# ACCUMCHECK_TORCH_INDEX adds an index for torch (PyPI's torch 2.13.0 is a
# CUDA build of several GB: https://download.pytorch.org/whl/cpu has the
# CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
[ "$(id -u)" -eq 0 ] || { echo "check-clean-system: needs root (debootstrap, chroot, mount): sudo bash $0" >&2; exit 2; }
t_start=$SECONDS
suite=bookworm
torch_pin=torch==2.13.0
pipx_pin=pipx==1.18.4

wheel=${1:-}
if [ -z "$wheel" ]; then
  wheel=$(ls -t dist/accumcheck-*manylinux*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    bash scripts/build-wheel.sh dist
    wheel=$(ls -t dist/accumcheck-*manylinux*.whl | head -1)
  fi
fi
[ -f "$wheel" ] || { echo "check-clean-system: no wheel $wheel" >&2; exit 2; }
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
echo "check-clean-system: $(basename "$wheel")"

# The Debian root, cached as a tarball.
cache=${ACCUMCHECK_CLEAN_ROOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/accumcheck}
tarball=$cache/clean-root-$suite-python.tar
if [ ! -f "$tarball" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  mirror=${ACCUMCHECK_DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then
    # The first Debian archive the host's apt names (deb822 or one-line).
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
      | grep -oE '(URIs: *|^deb +(\[[^]]*\] +)?)[a-z]+://[^ ]*/debian/?( |$)' \
      | grep -oE '[a-z]+://[^ ]*' | head -1 || true)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
  t0=$SECONDS
  mkdir -p "$cache"
  root=$(mktemp -d /tmp/accumcheck-root.XXXXXX)
  debootstrap --variant=minbase --include=python3-venv "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log"; echo "check-clean-system: debootstrap from $mirror failed" >&2; exit 1; }
  rm -rf "$root/var/cache/apt/archives/"*.deb
  tar -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf --one-file-system "$root" "$root.log"
  echo "check-clean-system: Debian $suite root (minbase + python3-venv) from $mirror in $((SECONDS - t0)) s, cached in $tarball"
fi

# A fresh copy of the root, its mounts, and the way out.
root=$(mktemp -d /tmp/accumcheck-clean.XXXXXX)
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" || true; done
  # Never remove through a mount that is still there (a bound host folder).
  if grep -q " $root" /proc/mounts; then
    echo "check-clean-system: $root still has mounts; not removed" >&2
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
t0=$SECONDS
tar -C "$root" -xf "$tarball"
size=$(du -sm "$root" | cut -f1)
bind_ro() {  # bind_ro DIR: the host's folder, read-only, at the same place
  local p=$1
  mkdir -p "$root$p"
  mount --bind "$p" "$root$p"; mounts+=("$root$p")
  mount -o remount,bind,ro "$root$p"
}
mount -t proc proc "$root/proc"; mounts+=("$root/proc")
mount --bind /dev "$root/dev"; mounts+=("$root/dev")
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# The host's pip configuration (every config file pip reads, PIP_*
# variables) and the local files and folders it names: files copied,
# folders the root lacks bound read-only (here: /opt/wheels holds
# torch 2.13.0's CPU wheel; elsewhere pip reaches the index).
pip_env=()
while IFS= read -r v; do pip_env+=("$v"); done < <(env | grep -E '^PIP_' || true)
confs=$(python3 -m pip config debug 2>/dev/null | sed -n 's/^ *\(\/[^,]*\), exists: True$/\1/p' || true)
for f in $confs; do mkdir -p "$root$(dirname "$f")"; cp "$f" "$root$f"; done
for p in $( (cat $confs /dev/null; printf '%s\n' "${pip_env[@]}") \
    | grep -oE '(file://)?/[^ "]+' | sed 's|^file://||' | sort -u); do
  # A local index (DIR/simple) links its files relatively (DIR/files).
  case $p in */simple | */simple/) p=$(dirname "$p") ;; esac
  if [ -f "$p" ]; then mkdir -p "$root$(dirname "$p")"; cp "$p" "$root$p"
  elif [ -d "$p" ] && [ ! -e "$root$p" ]; then bind_ro "$p"
  fi
done
mkdir -p "$root/tmp/check"
cp "$wheel" "$root/tmp/check/"
cp -r examples "$root/tmp/check/examples"
echo "check-clean-system: root unpacked in $((SECONDS - t0)) s ($size MB)"

# The check itself, inside the root.
cat >"$root/tmp/check/check.sh" <<'EOF'
set -euo pipefail
cd /tmp/check
wheel=$(ls /tmp/check/accumcheck-*.whl)
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
fail() { echo "FAIL: $*"; exit 1; }
echo "inside: $(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version), $(dpkg-query -W -f='${binary:Package}\n' | wc -l) packages installed"
for lib in libmpfr.so.6 libfmt.so.9 libtomlplusplus.so.3 libcudart.so.13 libcuda.so.1; do
  if ldconfig -p | grep -q "$lib"; then fail "$lib is on this system: not a clean one"; fi
done
echo "inside: none of MPFR, fmt, toml++, the CUDA runtime or driver is installed"

t0=$SECONDS
python3 -m venv /root/venv
/root/venv/bin/pip install -q --disable-pip-version-check "$wheel" "$TORCH_PIN" \
  ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} 2>&1 | quiet
echo "inside: pip install $(basename "$wheel") $TORCH_PIN: $((SECONDS - t0)) s"
export PATH=/root/venv/bin:$PATH
cmd=$(command -v accumcheck)
[ "$cmd" = /root/venv/bin/accumcheck ] || fail "accumcheck is $cmd"

echo "inside: ldd $cmd"
ldd "$cmd" | sed 's/ (0x[0-9a-f]*)//; s/^/  /'
ldd "$cmd" | while read -r name arrow path rest; do
  case $name in linux-vdso.so.* | /lib64/ld-linux-x86-64.so.2) continue ;; esac
  [ "$arrow" = "=>" ] && [ -n "$path" ] && [ "$path" != "not" ] || fail "ldd: $name not resolved"
  real=$(readlink -f "$path")
  case $real in /root/venv/lib/accumcheck/*) continue ;; esac
  case $name:$real in
    libc.so.6:/usr/lib/x86_64-linux-gnu/* | libm.so.6:/usr/lib/x86_64-linux-gnu/* | \
      libstdc++.so.6:/usr/lib/x86_64-linux-gnu/* | libgcc_s.so.1:/usr/lib/x86_64-linux-gnu/*) ;;
    *) fail "ldd: $name resolves to $real, outside the C library, libstdc++, libgcc and the wheel" ;;
  esac
done

v_cmd=$(accumcheck --version)
v_py=$(python -c 'import accumcheck_torch; print(accumcheck_torch.__version__)')
[ "$v_cmd" = "accumcheck $v_py" ] || fail "accumcheck --version says '$v_cmd', accumcheck_torch.__version__ '$v_py'"
echo "inside: $v_cmd; accumcheck_torch.__version__ $v_py"

accumcheck run scheduler-per-micro-step --engine device --rows 4 --no-trace >run.txt \
  || { cat run.txt; fail "accumcheck run --engine device"; }
grep -q '^verdict' run.txt || { cat run.txt; fail "no verdict from --engine device"; }
echo "inside: accumcheck run --engine device: $(head -1 run.txt)"
set +e
accumcheck run scheduler-per-micro-step --engine cuda --no-trace >cuda.txt 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat cuda.txt; fail "--engine cuda without a GPU exited $rc, not 2"; }
grep -q "no CUDA device" cuda.txt || { cat cuda.txt; fail "the wheel has no CUDA executor"; }
echo "inside: accumcheck run --engine cuda: exit 2: $(head -1 cuda.txt)"

t0=$SECONDS
accumcheck export certify-mlp --out bundle --quiet 2>export.txt || { cat export.txt; fail "accumcheck export"; }
python examples/oracle/train_correct.py --bundle bundle --out trace >/dev/null
accumcheck certify certify-mlp --trace trace >certify.txt 2>&1 || { cat certify.txt; fail "certify of train_correct.py"; }
grep -E '^(PASS|FAIL)' certify.txt | sed 's/^/inside: /'
grep -q '^PASS' certify.txt || { cat certify.txt; fail "certify did not PASS"; }
echo "inside: export, examples/oracle/train_correct.py, certify: PASS in $((SECONDS - t0)) s"

t0=$SECONDS
python3 -m venv /opt/pipx
/opt/pipx/bin/pip install -q --disable-pip-version-check "$PIPX_PIN" 2>&1 | quiet
/opt/pipx/bin/pipx install -q "$wheel" >/dev/null 2>&1 || /opt/pipx/bin/pipx install "$wheel"
found=$(env PATH=/root/.local/bin:/usr/bin:/bin sh -c 'command -v accumcheck')
[ "$found" = /root/.local/bin/accumcheck ] || fail "pipx: accumcheck on PATH is '$found'"
out=$(env PATH=/root/.local/bin:/usr/bin:/bin accumcheck --version)
env PATH=/root/.local/bin:/usr/bin:/bin accumcheck list >list.txt
grep -q '^certify-mlp ' list.txt || fail "pipx: accumcheck list has no certify-mlp"
echo "inside: pipx install: $found ($out) in $((SECONDS - t0)) s"
EOF
t0=$SECONDS
env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TORCH_PIN="$torch_pin" \
  TORCH_INDEX="${ACCUMCHECK_TORCH_INDEX:-}" \
  PIPX_PIN="$pipx_pin" "${pip_env[@]}" chroot "$root" bash /tmp/check/check.sh
echo "check-clean-system: PASS (inside the root $((SECONDS - t0)) s; in all $((SECONDS - t_start)) s)"
