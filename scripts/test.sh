#!/usr/bin/env bash
# Quick start, command 2: set up, build, and run every test (unit tests,
# property tests, one test per scenario) with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
source scripts/build-quiet.sh
seed_test_order build tests/ctest-costs/gcc.txt
ctest --test-dir build --output-on-failure -j"$jobs" "$@"
