#!/usr/bin/env bash
# README "Sanitizers, fuzzing and clang": build with clang 14 into
# build-asan/ with AddressSanitizer + LeakSanitizer + UndefinedBehavior-
# Sanitizer and libFuzzer coverage, warnings as errors (so this build is
# also the proof that clang 14 builds the project warning-free), run the
# tests under the sanitizers, then each fuzz target from its seed corpus.
#
#   bash scripts/check-hardened.sh        full (local): every test, 100
#                                         RapidCheck cases per property,
#                                         each fuzz target 60 s
#   bash scripts/check-hardened.sh --ci   CI (.ci/run), within CI's 15
#                                         minutes: README says what it
#                                         leaves out
#   FUZZ_SECONDS=0 bash scripts/check-hardened.sh   no fuzzing
#
# The CI mode differs in three ways, nothing else (same build, same flags):
#  - property tests run 25 RapidCheck cases instead of 100 (ACCUMCHECK_RC_
#    CASES; same pinned seed);
#  - of the PyTorch-driven tests (PyTorch.*, Memory.PyTorch.*: a Python
#    trainer writes a trace, the sanitized accumcheck judges it) it runs
#    one per kind (CI_KEEP below) instead of all 71: the others feed the
#    same export, trace reader and certify/memory stages other traces;
#  - each fuzz target runs 30 s instead of 60.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
case "${1:-}" in
  "") ;;
  --ci) mode=ci ;;
  *) echo "usage: $0 [--ci]" >&2; exit 2 ;;
esac
if [ "$mode" = ci ]; then
  rc_cases=25 fuzz_seconds=${FUZZ_SECONDS:-30}
else
  rc_cases=100 fuzz_seconds=${FUZZ_SECONDS:-60}
fi
# CI mode: the PyTorch-driven tests it keeps, one per kind (certify PASS,
# certify FAIL with its diagnosis, the contract tier, the adapter's
# pytest, accumcheck memory against PyTorch's allocations).
CI_KEEP='^(PyTorch\.certify\.correct|PyTorch\.certify\.zero_grad_inside|PyTorch\.contract\.gpt\.mean_over_k|PyTorch\.pytest|Memory\.PyTorch\.certify-mlp\.b4)$'
CI_SKIP='^(PyTorch|Memory\.PyTorch)\.'

bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
source scripts/build-quiet.sh
use_compiler_cache
t0=$SECONDS
# -gline-tables-only: file:line in every sanitizer report at a fraction of
# -g's compile time.
cmake -S . -B build-asan -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DACCUMCHECK_CUDA=OFF -DACCUMCHECK_SANITIZE=ON -DACCUMCHECK_FUZZ=ON \
  -DACCUMCHECK_WERROR=ON -DACCUMCHECK_RC_CASES=$rc_cases $cache_args \
  ${ACCUMCHECK_CMAKE_ARGS:-} >build-asan.configure.log 2>&1 \
  || { cat build-asan.configure.log; exit 1; }
build_quiet build-asan "$jobs"
echo "check-hardened: build took $((SECONDS - t0)) s"
source scripts/sanitizer-env.sh
t0=$SECONDS
if [ "$mode" = ci ]; then
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -E "$CI_SKIP"
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -R "$CI_KEEP"
else
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
fi
echo "check-hardened: tests ($mode) took $((SECONDS - t0)) s"
bash scripts/fuzz.sh "$fuzz_seconds"
