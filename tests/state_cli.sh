#!/usr/bin/env bash
# The training state of an engine run, through the public CLI only:
# `accumcheck run --engine device` writes the loss scale, skipped windows
# and EMA as state.csv rows (one `run` column, several runs side by side)
# and `accumcheck certify --run NAME` judges the named run's rows with its
# state checks.  Registered with CTest as StateCli.<case>
# (cli/CMakeLists.txt).
#
#   tests/state_cli.sh CASE path/to/accumcheck SOURCE_DIR
set -u
case_name=$1 bin=$2 src=$3
source "$(dirname "$0")/cli_lib.sh"

# trace SCENARIO_FILE: the device engine's runs of it in $tmp/tr.
trace() {
  "$bin" run "$1" --engine device --quiet --out "$tmp/tr" >/dev/null ||
    fail "accumcheck run $1 failed"
  [ -f "$tmp/tr/state.csv" ] || fail "no state.csv in the trace"
  head -1 "$tmp/tr/state.csv" | grep -qx 'run,kind,step,tensor,index,value' ||
    fail "state.csv header: $(head -1 "$tmp/tr/state.csv")"
  if head -1 "$tmp/tr/events.csv" | grep -q loss_scale; then
    fail "events.csv still has a loss_scale column"
  fi
}

case $case_name in
  mixed_precision_pass)
    # bf16 gradient buffer, GradScaler with an overflow at window 2, EMA:
    # the correct run passes with every state check ok.  The buffer's
    # rounding is judged with the bf16 bound (--precision bf16).
    trace "$src/scenarios/mixed-precision-correct.toml"
    for check in 'ok   loss scale: 32 backward passes, the scale constant within every window; 1 window\(s\) skipped' \
        'ok   skipped steps: 1 window\(s\) skipped for overflow' \
        'ok   EMA: 7 updates, one after each optimizer step' '^PASS'; do
      expect 0 "$check" -- "$bin" certify \
        "$src/scenarios/mixed-precision-correct.toml" --trace "$tmp/tr" \
        --run correct --precision bf16
    done
    ;;
  ema_every_micro_step)
    # The same trace holds the correct run (passes) and the pitfall's
    # (its EMA rows name it).
    trace "$src/scenarios/ema-every-micro-step.toml"
    expect 0 'ok   EMA: 8 updates, one after each optimizer step' -- \
      "$bin" certify "$src/scenarios/ema-every-micro-step.toml" \
      --trace "$tmp/tr" --run correct
    expect 1 'state finding: ema-every-micro-step: .* the EMA is updated every micro-step' -- \
      "$bin" certify "$src/scenarios/ema-every-micro-step.toml" \
      --trace "$tmp/tr" --run ema-every-micro-step
    ;;
  scaler_update_every_micro_step)
    # The shipped scenario with a growth interval of 3 backward passes:
    # the scaler updated every micro-step grows the scale inside a window.
    sed 's/^growth_interval = .*/growth_interval = 3/' \
      "$src/scenarios/scaler-update-every-micro-step.toml" >"$tmp/s.toml"
    grep -q '^growth_interval = 3$' "$tmp/s.toml" || fail "no growth_interval"
    trace "$tmp/s.toml"
    expect 0 'ok   loss scale: 64 backward passes, the scale constant within every window' -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct
    expect 1 'state finding: scaler-update-every-micro-step: the loss scale changed within the window of optimizer step 0' -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" \
      --run scaler-update-every-micro-step
    ;;
  scale_out_of_range)
    # A scale grown beyond 2^62 (the engines weigh losses exactly up to
    # it): the scenario is named, exit 2 (it used to be exit 3).  A
    # candidate semantics of certify's ranking that grows it that far is
    # dropped (infinitely far), not a crash.
    sed 's/^growth_interval = .*/growth_interval = 1/' \
      "$src/scenarios/scaler-update-every-micro-step.toml" >"$tmp/one.toml"
    expect 2 "one.toml: precision: loss scale 2\^63 leaves the exactly representable loss weights" -- \
      "$bin" run "$tmp/one.toml" --engine device --quiet --out "$tmp/one"
    sed 's/^growth_interval = .*/growth_interval = 2/' \
      "$src/scenarios/scaler-update-every-micro-step.toml" >"$tmp/s.toml"
    trace "$tmp/s.toml"
    expect 1 'state finding: scaler-update-every-micro-step: the loss scale changed' -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" \
      --run scaler-update-every-micro-step
    ;;
  malloc_tuning)
    # certify tunes glibc's malloc (cli/main.cpp, tune_malloc_for_certify)
    # in its own process for a trace this small, or runs itself again once
    # with glibc's tunables (ACCUMCHECK_MALLOC_RUN_AGAIN=1 takes that way
    # here): the same output and JUnit as with glibc's defaults either way,
    # every argument passed on (a path with a space in it).
    trace "$src/scenarios/mixed-precision-correct.toml"
    mv "$tmp/tr" "$tmp/a trace"
    "$bin" certify "$src/scenarios/mixed-precision-correct.toml" \
      --trace "$tmp/a trace" --run correct --precision bf16 \
      --junit "$tmp/tuned.xml" >"$tmp/tuned.txt" 2>&1 || fail "tuned certify failed"
    ACCUMCHECK_MALLOC_RUN_AGAIN=1 "$bin" certify \
      "$src/scenarios/mixed-precision-correct.toml" --trace "$tmp/a trace" \
      --run correct --precision bf16 --junit "$tmp/again.xml" \
      >"$tmp/again.txt" 2>&1 || fail "certify run again with tunables failed"
    ACCUMCHECK_MALLOC_DEFAULTS=1 "$bin" certify \
      "$src/scenarios/mixed-precision-correct.toml" --trace "$tmp/a trace" \
      --run correct --precision bf16 --junit "$tmp/plain.xml" \
      >"$tmp/plain.txt" 2>&1 || fail "certify with glibc's defaults failed"
    grep -q '^PASS' "$tmp/tuned.txt" || fail "no PASS: $(cat "$tmp/tuned.txt")"
    diff <(grep -v '^certify: .* s$' "$tmp/tuned.txt") \
      <(grep -v '^certify: .* s$' "$tmp/plain.txt") || fail "outputs differ"
    diff <(grep -v '^certify: .* s$' "$tmp/again.txt") \
      <(grep -v '^certify: .* s$' "$tmp/plain.txt") || fail "outputs differ (run again)"
    diff <(sed 's/ time="[^"]*"//g' "$tmp/tuned.xml") \
      <(sed 's/ time="[^"]*"//g' "$tmp/plain.xml") || fail "JUnit files differ"
    diff <(sed 's/ time="[^"]*"//g' "$tmp/again.xml") \
      <(sed 's/ time="[^"]*"//g' "$tmp/plain.xml") || fail "JUnit files differ (run again)"
    echo "the same output and JUnit, tuned in process, run again with glibc's tunables and with glibc's defaults"
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "ok [$case_name]"
