#!/usr/bin/env bash
# The package as a user gets it: `pip wheel` builds accumcheck's wheel from
# this source tree (the project's own CMake through scikit-build-core), a
# fresh virtual environment outside the tree installs it offline beside
# torch, and a trainer written there (user_trainer.py, with its pytest
# test) is certified through the pytest plugin: the correct loop PASSes,
# the mistaken one FAILs with certify's diagnosis in the assertion.  Also:
# `accumcheck --version`, the installed scenarios, an example trainer run as
# `python examples/oracle/train_correct.py` and certified.
#   wheel_install.sh SOURCE_DIR CXX_COMPILER PYTHON TORCH_PYTHON
# PYTHON: an interpreter to make the venv from (the project's .venv's base);
# TORCH_PYTHON: the project's .venv's, whose torch, numpy and pytest the
# fresh venv is given.
set -euo pipefail
src=$1 cxx=$2 python=$3 torch_python=$4
work=$(mktemp -d /tmp/accumcheck-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

# The wheel, in build-wheel/ beside build/ with the same compiler: ccache
# (scripts/build-quiet.sh's settings) then reuses build/'s objects.
t0=$SECONDS
if command -v ccache >/dev/null && [ "${ACCUMCHECK_NO_CCACHE:-0}" != 1 ]; then
  export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
command -v ninja >/dev/null && export CMAKE_GENERATOR=Ninja
"$python" -m pip wheel "$src" --no-deps -q -w "$work/dist" -Cbuild-dir="$src/build-wheel" \
  -Ccmake.define.CMAKE_CXX_COMPILER="$cxx" 2>&1 | quiet
wheel=$(ls "$work"/dist/accumcheck-*.whl)
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) built in $((SECONDS - t0)) s"

# A fresh environment holding torch, numpy and pytest as pip installed
# them: TORCH_PYTHON's (the pins of requirements.txt, checked), each
# distribution of their requirements' closure, and pip, linked into the
# new venv's site-packages (its top-level folders, modules and dist-info),
# not unpacked again from the index (pip install torch, numpy and pytest
# into a fresh venv cost ~20 s of CPU and its venv's ensurepip 4.5 s).
# pip, importlib.metadata and the pytest11 entry points see them as
# installed there.
t0=$SECONDS
"$python" -m venv --without-pip "$work/venv"   # pip too is linked (ensurepip: 4.5 s)
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$torch_python" - "$site" "$src/requirements.txt" <<'PY'
import importlib.metadata as md
import os
import re
import sys

site = sys.argv[1]
pins = dict(line.split("#")[0].strip().split("==") for line in open(sys.argv[2])
            if line.split("==")[0].strip() in ("torch", "numpy", "pytest"))
assert len(pins) == 3, pins
pending, seen, links = list(pins) + ["pip"], set(), 0
while pending:
    name = re.sub(r"[-_.]+", "-", pending.pop()).lower()
    if name in seen:
        continue
    seen.add(name)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:  # a requirement under a marker not met here
        continue
    if name in pins and dist.version.split("+")[0] != pins[name]:
        sys.exit("FAIL: %s is %s in %s, requirements.txt pins %s" % (name, dist.version, sys.prefix, pins[name]))
    pending += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    for top in sorted({f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}):
        if not os.path.lexists(os.path.join(site, top)):
            os.symlink(dist.locate_file(top), os.path.join(site, top))
            links += 1
print("venv: %d distributions (torch %s, numpy %s, pytest %s) linked from %s (%d entries)"
      % (len(seen), md.version("torch"), md.version("numpy"), md.version("pytest"), sys.prefix, links))
PY
echo "venv: made in $((SECONDS - t0)) s"
t0=$SECONDS
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$wheel"
echo "wheel: installed offline in $((SECONDS - t0)) s"
export PATH=$work/venv/bin:$PATH
v_cmd=$(accumcheck --version)
python -c 'from importlib import metadata as m; r = m.requires("accumcheck"); assert any(x.startswith("numpy") for x in r), r' \
  || { echo "FAIL: the wheel does not declare numpy"; exit 1; }
# The command's libraries: the C library, libm, libstdc++, libgcc_s, and
# the wheel's own (ENV/lib/accumcheck/: MPFR, GMP, fmt, toml++).  No BLAS:
# the engine's matrix product is its own kernel (kern::MatMul), so neither
# OpenBLAS nor its Fortran runtime may travel in the wheel.
bad=$(ldd "$work/venv/bin/accumcheck" | while read -r name arrow path rest; do
  case $name in linux-vdso.so.* | /lib64/ld-linux-x86-64.so.2) continue ;; esac
  [ "$arrow" = "=>" ] && [ -n "$path" ] && [ "$path" != "not" ] || { echo "$name not resolved"; continue; }
  case $(readlink -f "$path") in "$work"/venv/lib/accumcheck/*) continue ;; esac
  case $name in libc.so.6 | libm.so.6 | libstdc++.so.6 | libgcc_s.so.1) ;; *) echo "$name => $path" ;; esac
done)
[ -z "$bad" ] || { echo "FAIL: the installed command links outside the wheel: $bad"; ldd "$work/venv/bin/accumcheck"; exit 1; }
blas=$(cd "$work/venv/lib/accumcheck" && ls | grep -E '^lib(openblas|blas|cblas|gfortran|quadmath|cublas)' || true)
[ -z "$blas" ] || { echo "FAIL: the wheel carries a BLAS or its runtime: $blas"; exit 1; }
echo "ldd: $(ldd "$work/venv/bin/accumcheck" | grep -c "/lib/accumcheck/") libraries from the wheel, the rest the C library, libstdc++, libgcc"
accumcheck list >"$work/list.txt"
grep -q '^certify-mlp ' "$work/list.txt" || { echo "FAIL: accumcheck list does not show the installed scenarios"; exit 1; }

# The user's own trainer and its CI test, in a folder of their own.
mkdir "$work/user"
cp "$src/tests/package/user_trainer.py" "$src/tests/package/test_user_trainer.py" "$work/user/"
# pytest run as `python -m pytest` runs it (pytest.main: the plugin found by
# its entry point and imported by pytest), then, in the same interpreter,
# the package's version read: one version, the command's, the package's
# and the wheel's metadata.  One interpreter importing torch, not two
# (4.5 s of CPU).
(cd "$work/user" && python -c '
import sys

import pytest

code = pytest.main(["-q", "-p", "no:cacheprovider", "--junitxml=" + sys.argv[1]])
import accumcheck_torch  # noqa: E402  (imported by the plugin already)

with open(sys.argv[2], "w") as f:
    f.write(accumcheck_torch.__version__ + "\n")
sys.exit(code)
' "$work/user/report.xml" "$work/user/version.txt")
v_py=$(cat "$work/user/version.txt")
[ "$v_cmd" = "accumcheck $v_py" ] \
  || { echo "FAIL: accumcheck --version says '$v_cmd', accumcheck_torch.__version__ '$v_py'"; exit 1; }
echo "$v_cmd (accumcheck_torch.__version__ $v_py)"
n=$(ls "$work/user/accumcheck"/*.xml | wc -l)
[ "$n" = 2 ] || { echo "FAIL: expected certify's 2 JUnit files beside pytest's, found $n"; exit 1; }
echo "pytest plugin: certify's JUnit beside pytest's ($n files)"

# An example trainer, run as the README shows it, certified.
(cd "$work" && accumcheck export certify-mlp --out bundle --quiet 2>/dev/null &&
  python "$src/examples/oracle/train_correct.py" --bundle bundle --out trace >/dev/null &&
  accumcheck certify certify-mlp --trace trace --quiet)
echo "driver: ok"
