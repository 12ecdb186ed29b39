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
# .venv/ (torch's wheel unpacked and compiled to bytecode: about 50 s) is
# made while the C++ builds, then .venv-jax/ on it; the build's first
# configure sees .venv/bin/python without torch yet, so CMake is configured
# again once they are made.
bash scripts/setup.sh --no-venv
bash scripts/venv.sh --interpreter
mkdir -p build
venv_log=build/venv.log
venv_start=$SECONDS
{
  bash scripts/venv.sh || exit 1
  failed=0
  if [ "$jax" = 1 ]; then bash scripts/venv-jax.sh || failed=2; fi
  if [ "$deepspeed" = 1 ]; then bash scripts/venv-deepspeed.sh || failed=$((failed + 4)); fi
  exit "$failed"
} >"$venv_log" 2>&1 &
venv_pid=$!
bash scripts/build.sh --no-venv
venv_status=0
wait "$venv_pid" || venv_status=$?
if [ "$venv_status" = 1 ]; then
  cat "$venv_log"
  echo "test: making .venv failed ($venv_log)"
  exit 1
fi
grep -E '^venv' "$venv_log" || true
echo "test: the virtual environments were made $((SECONDS - venv_start)) s after they were started"
[ $((venv_status & 6)) = 0 ] || tail -n 20 "$venv_log"
[ $((venv_status & 2)) = 0 ] || echo "test: making .venv-jax failed ($venv_log): the JAX cases are skipped"
[ $((venv_status & 4)) = 0 ] || echo "test: making .venv-deepspeed failed ($venv_log): the DeepSpeed cases are skipped"
# Configure again: CMake looks for torch in .venv/, and for .venv-jax/ and
# .venv-deepspeed/, at configure time.
cmake build >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
grep -E '^-- accumcheck: .*(torch|deepspeed|jax)' build.configure.log || true
jobs=$(nproc 2>/dev/null || echo 2)
source scripts/build-quiet.sh
use_compiler_cache  # build.sh's ccache settings
build_quiet build "$jobs"  # a no-op unless the second configure changed it
seed_test_order build tests/ctest-costs/gcc.txt
ctest --test-dir build --output-on-failure --output-junit ctest-junit.xml -j"$jobs" "$@"
