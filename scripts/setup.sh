#!/usr/bin/env bash
# Installs the Debian packages accumcheck builds and tests with, and the
# Python side's virtual environment (.venv/: torch 2.13.0 and pytest, pinned
# in requirements.txt; scripts/venv.sh).  Idempotent: when everything is
# already present it changes nothing and does not touch the network.
#   bash scripts/setup.sh            the packages, then .venv/
#   bash scripts/setup.sh --no-venv  the packages only (scripts/test.sh makes
#                                    .venv/ beside the C++ build)
set -euo pipefail
venv=1
case "${1:-}" in
  "") ;;
  --no-venv) venv=0 ;;
  *) echo "usage: $0 [--no-venv]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake pkg-config
  ninja-build  # scripts/build-quiet.sh: the build's generator
  ccache  # scripts/build-quiet.sh: a rebuild or a second clone compiles only what changed
  libboost-dev libmpfr-dev libgmp-dev
  librapidcheck-dev libgtest-dev libfccp-dev libtomlplusplus-dev
  libcli11-dev libfmt-dev libbenchmark-dev
  libqd-dev  # bench/bound_bench: qd's dd_real beside our double-double
  # scripts/check-hardened.sh: clang 14 with its sanitizer and libFuzzer
  # runtimes (Debian 12 ships libFuzzer in libclang-rt-14-dev).
  clang-14 libclang-rt-14-dev
)
# `accumcheck report`'s HTML is tested in headless Chromium (about 350 MB
# installed; apt-get update + install took 60 s here).
if [ "${ACCUMCHECK_NO_CHROMIUM:-0}" != 1 ]; then packages+=(chromium); fi
# npm fetches the charting library the report inlines (scripts/vendor_js.sh);
# a Node.js that brings its own npm (NodeSource) is kept.
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  bash "$(dirname "$0")/vendor_js.sh"
  [ "$venv" = 0 ] || bash "$(dirname "$0")/venv.sh"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
bash "$(dirname "$0")/vendor_js.sh"
[ "$venv" = 0 ] || bash "$(dirname "$0")/venv.sh"
