#!/usr/bin/env bash
# The contract tier's cost beside the trainer's own run (issue 11: <= 3x):
# the GPT-style decoder (adapters/pytorch/contract_examples) trained by the
# Transformers-style loop, once plain and once recorded by the
# ContractRecorder and judged by `accumcheck certify --contract`.  Times are
# the loop's own (python start-up and imports excluded from both) plus
# certify's wall time.  Usage: bench/contract_bench.sh [BUILD_DIR] [SAMPLES]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
samples=${2:-168}
py=/usr/bin/python3
train=$here/adapters/pytorch/contract_examples/train.py
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
secs() { sed -E 's/.*: ([0-9.]+) s.*/\1/'; }
plain=$($py "$train" --model gpt --loop transformers --samples "$samples" --no-record | secs)
rec=$($py "$train" --model gpt --loop transformers --samples "$samples" --out "$out/t" | secs)
cert=$( { /usr/bin/time -f '%e' "$build/cli/accumcheck" certify --contract --trace "$out/t" --quiet >/dev/null; } 2>&1 | tail -1)
steps=$(grep -c '^step,' "$out/t/contract.csv")
micro=$(grep -c '^micro,' "$out/t/contract.csv")
awk -v p="$plain" -v r="$rec" -v c="$cert" -v s="$steps" -v m="$micro" 'BEGIN {
  printf "GPT-style decoder (105k parameters), %d micro-batches, %d optimizer steps, 1 thread\n", m, s;
  printf "  trainer alone                    %8.3f s\n", p;
  printf "  trainer + ContractRecorder       %8.3f s\n", r;
  printf "  accumcheck certify --contract    %8.3f s\n", c;
  printf "  certify / train                  %8.2fx\n", (r + c) / p }'
