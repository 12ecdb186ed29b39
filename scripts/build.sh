#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds
# accumcheck into build/ (Release, -Wall -Wextra).  Safe to rerun.
#   bash scripts/build.sh            set-up, then the build
#   bash scripts/build.sh --no-venv  without making .venv/ first
#                                    (scripts/test.sh makes it beside the build)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") bash scripts/setup.sh ;;
  --no-venv) bash scripts/setup.sh --no-venv ;;
  *) echo "usage: $0 [--no-venv]" >&2; exit 2 ;;
esac
jobs=$(nproc 2>/dev/null || echo 2)
source scripts/build-quiet.sh
use_compiler_cache
generator_args build
cmake -S . -B build $generator_flags -DCMAKE_BUILD_TYPE=Release $cache_args \
  ${ACCUMCHECK_CMAKE_ARGS:-} >build.configure.log 2>&1 \
  || { cat build.configure.log; exit 1; }
grep -E '^-- accumcheck:' build.configure.log || true
build_quiet build "$jobs"
