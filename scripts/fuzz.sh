#!/usr/bin/env bash
# Runs each libFuzzer target in build-asan/fuzz (scripts/check-hardened.sh
# builds them) for SECONDS seconds (default 60), all at once, from
# its seed corpus fuzz/corpus/<target>.  New inputs go to a scratch corpus
# build-asan/fuzz-corpus/<target> (kept between runs, never committed);
# a crash leaves its input in build-asan/fuzz-artifacts/ and fails.
#   bash scripts/fuzz.sh 60              # every target, 60 s each
#   bash scripts/fuzz.sh 3600 trace      # one target for an hour
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(scenario trace data_csv)
[ "$seconds" -gt 0 ] || { echo "fuzz: skipped (0 s)"; exit 0; }
source scripts/sanitizer-env.sh
mkdir -p build-asan/fuzz-artifacts
for t in "${targets[@]}"; do
  bin=build-asan/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: $bin missing: run scripts/check-hardened.sh"; exit 1; }
  mkdir -p "build-asan/fuzz-corpus/$t"
done
# All targets at once: a target is one process on one core, so on this
# 2-core machine three side by side finish in SECONDS, not 3 x SECONDS
# (each gets about 2/3 of a core: the executions below say how many).
pids=()
for t in "${targets[@]}"; do
  build-asan/fuzz/fuzz_$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix=build-asan/fuzz-artifacts/"$t"- \
    "build-asan/fuzz-corpus/$t" "fuzz/corpus/$t" >"build-asan/fuzz-$t.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  log=build-asan/fuzz-$t.log
  if ! wait "${pids[$i]}"; then
    tail -n 60 "$log"
    echo "fuzz: $t FAILED (input in build-asan/fuzz-artifacts/)"
    failed=1
    continue
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -E '^#[0-9]+.*(DONE|INITED).*cov: ' "$log" | tail -n 1 | sed -E 's/.*cov: ([0-9]+).*/\1/')
  echo "fuzz: $t: $runs executions in $seconds s ($rate exec/s), coverage $cov edges, no crash"
done
exit "$failed"
