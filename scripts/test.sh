#!/usr/bin/env bash
# Quick start, command 2: set up, build, and run every test (unit tests,
# property tests, one test per scenario) with CTest.
#
#   bash scripts/test.sh [CTEST ARGS]     every test
#   bash scripts/test.sh --deepspeed      also makes .venv-deepspeed/
#                                         (scripts/venv-deepspeed.sh) while
#                                         the C++ builds, so that the
#                                         DeepSpeed cases run
#   bash scripts/test.sh --no-jax         without making .venv-jax/
#                                         (ACCUMCHECK_NO_JAX=1 too): by
#                                         default scripts/venv-jax.sh makes
#                                         it while the C++ builds, so that
#                                         the JAX.* cases run
#
# docs/development.md "CI and its budget" says what each costs.  When the
# DeepSpeed install fails, its log's tail says so and the DeepSpeed cases
# are skipped (CMake's message); every other test runs.
set -euo pipefail
cd "$(dirname "$0")/.."
deepspeed=0
jax=1
[ "${ACCUMCHECK_NO_JAX:-0}" = 1 ] && jax=0
[ "${ACCUMCHECK_NO_TORCH:-0}" = 1 ] && jax=0  # .venv-jax is layered on .venv
while [ $# -gt 0 ]; do
  case "$1" in
    --deepspeed) deepspeed=1 ;;
    --no-jax) jax=0 ;;
    *) break ;;
  esac
  shift
done
if [ "$deepspeed" = 1 ]; then
  bash scripts/setup.sh  # .venv/ first: .venv-deepspeed/ is layered on it
  mkdir -p build
  ds_log=build/deepspeed-venv.log
  bash scripts/venv-deepspeed.sh >"$ds_log" 2>&1 &
  ds_pid=$!
fi
if [ "$jax" = 1 ]; then
  bash scripts/setup.sh  # .venv/ first: .venv-jax/ is layered on it
  mkdir -p build
  jax_log=build/jax-venv.log
  jax_start=$SECONDS
  bash scripts/venv-jax.sh >"$jax_log" 2>&1 &
  jax_pid=$!
fi
bash scripts/build.sh
reconfigure=$deepspeed
if [ "$jax" = 1 ]; then
  if wait "$jax_pid"; then
    echo "test: $(tail -n 1 "$jax_log") (.venv-jax: $((SECONDS - jax_start)) s after it started)"
    reconfigure=1
  else
    tail -n 20 "$jax_log"
    echo "test: making .venv-jax failed ($jax_log): the JAX cases are skipped"
  fi
fi
if [ "$deepspeed" = 1 ]; then
  if wait "$ds_pid"; then
    tail -n 1 "$ds_log"
  else
    tail -n 20 "$ds_log"
    echo "test: making .venv-deepspeed failed ($ds_log): the DeepSpeed cases are skipped"
  fi
fi
if [ "$reconfigure" = 1 ]; then
  # Configure again: CMake looks for .venv-deepspeed/ and .venv-jax/ at
  # configure time.
  cmake build >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
  grep -E '^-- accumcheck: .*(deepspeed|jax)' build.configure.log || true
fi
jobs=$(nproc 2>/dev/null || echo 2)
source scripts/build-quiet.sh
if [ "$reconfigure" = 1 ]; then
  use_compiler_cache  # build.sh's ccache settings
  build_quiet build "$jobs"  # a no-op unless the second configure changed it
fi
seed_test_order build tests/ctest-costs/gcc.txt
ctest --test-dir build --output-on-failure --output-junit ctest-junit.xml -j"$jobs" "$@"
