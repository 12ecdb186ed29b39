# Sourced by scripts/build.sh, scripts/test.sh and scripts/check-hardened.sh.
#
# use_compiler_cache: sets cache_args to the CMake arguments that put
# ccache in front of the C++ and CUDA compilers (scripts/setup.sh installs
# it) and exports its settings for the build, keyed so that a fresh clone in
# another folder hits what an earlier build compiled (CCACHE_BASEDIR: paths
# under the clone become relative; CCACHE_NOHASHDIR: the build folder is
# not hashed, so -g builds are shared too, their debug info naming the
# folder of the first compile; CCACHE_DEPEND: on a miss ccache takes the
# included files from the compiler's own -MD output, where it would
# otherwise run the preprocessor a second time to hash them: 22.7 s of
# CPU over the GCC build's 30 translation units, as much again for
# clang's, on every cold build such as CI's).  The cache is ccache's own
# (~/.cache/ccache, 5 GB at most); ACCUMCHECK_NO_CCACHE=1 turns it off.  A
# cold cache changes nothing but the time.
use_compiler_cache() {
  cache_args=""
  if [ "${ACCUMCHECK_NO_CCACHE:-0}" = 1 ] || ! command -v ccache >/dev/null; then
    return 0
  fi
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1
  cache_args="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
}

# generator_args DIR: the CMake arguments choosing Ninja (scripts/setup.sh
# installs ninja-build; it compiles a target's sources while the libraries
# it links are still building, where Make waits for them), after removing
# DIR's CMake cache when DIR was configured with another generator (a
# build folder from before Ninja), which CMake would otherwise refuse.
generator_args() {
  generator_flags=""
  command -v ninja >/dev/null || return 0
  if [ -f "$1/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$1/CMakeCache.txt"; then
    rm -rf "$1/CMakeCache.txt" "$1/CMakeFiles"
  fi
  generator_flags="-G Ninja"
}

build_quiet() {
  local status=0
  cmake --build "$1" -j"$2" 2>&1 \
    | grep -vE '^\[ *[0-9]+%\]|^\[[0-9]+/[0-9]+\] |^(Consolidate|Scanning|Built target)' \
    || status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    echo "build of $1 failed (exit $status)" >&2
    return "$status"
  fi
}

# seed_test_order DIR FILE: CTest starts the tests it expects to take
# longest first, by DIR/Testing/Temporary/CTestCostData.txt, which only an
# earlier CTest run in DIR writes; in a fresh clone it would start them in
# the order they are declared, the PyTorch DDP cases (one at a time: they
# share torchrun's port) last, as a tail on one core.  FILE
# (tests/ctest-costs/) holds the seconds each test over 2 s took in one
# measured run; it orders tests only (a test it does not name runs after
# those it names).  An existing cost file (from a later run) is kept.
# Measured in a fresh clone: the sanitized tests 341 s without it, 296 s
# with the costs of one run.
seed_test_order() {
  local costs=$1/Testing/Temporary/CTestCostData.txt
  if [ ! -f "$costs" ]; then
    mkdir -p "$(dirname "$costs")"
    cp "$2" "$costs"
  fi
}
