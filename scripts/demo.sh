#!/usr/bin/env bash
# Quick start, command 1: set up, build, and run the flagship scenario
# side by side (large batch | correct accumulation | zero_grad in the loop).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/cli/accumcheck run scenarios/zero-grad-every-micro-step.toml "$@"
