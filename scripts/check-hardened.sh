#!/usr/bin/env bash
# CI, command 2 (README "Sanitizers and fuzzing"): build with clang 14 into
# build-asan/ with AddressSanitizer + LeakSanitizer + UndefinedBehavior-
# Sanitizer and libFuzzer coverage, warnings as errors (so this build is
# also the proof that clang 14 builds the project warning-free), run every
# test under the sanitizers, then each fuzz target for FUZZ_SECONDS
# (default 60) seconds from its seed corpus.
#   bash scripts/check-hardened.sh             # build, tests, fuzz
#   FUZZ_SECONDS=0 bash scripts/check-hardened.sh   # no fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-asan -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DACCUMCHECK_CUDA=OFF -DACCUMCHECK_SANITIZE=ON -DACCUMCHECK_FUZZ=ON \
  -DACCUMCHECK_WERROR=ON ${ACCUMCHECK_CMAKE_ARGS:-} >build-asan.configure.log 2>&1 \
  || { cat build-asan.configure.log; exit 1; }
cmake --build build-asan -j"$jobs" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^(Consolidate|Scanning|Built target)' || true
test "${PIPESTATUS[0]}" -eq 0
source scripts/sanitizer-env.sh
ctest --test-dir build-asan --output-on-failure -j"$jobs"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
