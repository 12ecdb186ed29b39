#!/usr/bin/env bash
# Careless and hostile inputs to the `accumcheck` command (issue 9): each
# case runs the binary and checks its exit code and the words of its
# message.  Registered with CTest as Hardening.<case> (cli/CMakeLists.txt).
#
#   tests/hardening_cli.sh CASE path/to/accumcheck SOURCE_DIR
set -u
case_name=$1 bin=$2 src=$3
source "$(dirname "$0")/cli_lib.sh"

# A small scenario with the given [data] / [batching] / [model] lines.
scenario() {  # file widths data_lines batching_lines [extra]
  cat >"$1" <<EOF
story = "hardening case"

[model]
widths = $2
activation = "tanh"

[data]
$3

[batching]
$4

[optimizer]
kind = "sgd"
lr = 0.1
${5:-}
EOF
}

# A trace of the correct trainer on a small scenario, for certify cases.
make_trace() {
  scenario "$tmp/s.toml" "[4, 8, 2]" "samples = 24
seed = 3" "micro_batch = 4
accumulation = 2
epochs = 2"
  "$bin" run "$tmp/s.toml" --engine device --quiet --out "$tmp/tr" >/dev/null ||
    fail "could not make the trace"
}

# Keeps the rows of run $1 only (header kept) in trace file $2.
only_run() {
  awk -F, -v r="$1" 'NR == 1 || $1 == r' "$2" >"$2.new" && mv "$2.new" "$2"
  reseal "$(dirname "$2")"
}

case $case_name in
  samples_overflow)  # used to be SIGSEGV (a heap overflow)
    scenario "$tmp/a.toml" "[4, 8, 2]" "samples = 4611686018427387905" \
      "micro_batch = 4
accumulation = 2"
    expect 2 'a.toml:[0-9]+:[0-9]+: data.samples: data.samples = 4611686018427387905 exceeds the limit samples = 10000000' -- \
      "$bin" run "$tmp/a.toml" --no-trace
    ;;
  samples_large)  # used to be bad_alloc (exit 3) after 30-45 s
    for n in 100000000 1000000000000; do
      scenario "$tmp/a.toml" "[4, 8, 2]" "samples = $n" "micro_batch = 4
accumulation = 2"
      expect 2 "data.samples = $n exceeds the limit samples" 10 -- \
        "$bin" run "$tmp/a.toml" --no-trace
    done
    ;;
  wide_deep)  # 20 hidden layers of 4096: 3.2e8 parameters
    w="[4$(printf ', 4096%.0s' $(seq 20)), 2]"
    scenario "$tmp/a.toml" "$w" "samples = 64" "micro_batch = 4
accumulation = 2"
    expect 2 'model.widths: the model.s 3[0-9]{8} parameters exceeds the limit parameters = 1000000' 10 -- \
      "$bin" run "$tmp/a.toml" --no-trace
    w="[4$(printf ', 8%.0s' $(seq 40)), 2]"
    scenario "$tmp/b.toml" "$w" "samples = 64" "micro_batch = 4
accumulation = 2"
    expect 2 'model.widths: 41 Linear layers \(42 widths\) exceeds the limit layers = 32' 10 -- \
      "$bin" run "$tmp/b.toml" --no-trace
    ;;
  oracle_work)  # within every size limit, but hours of oracle work
    scenario "$tmp/a.toml" "[64, 512, 512, 64]" "samples = 100000" \
      "micro_batch = 100
accumulation = 10
epochs = 10"
    expect 2 "batching.epochs: the oracle's estimated 3945216000000 multiply-adds \\(328768 parameters x 1000000 samples seen x 12\\) exceeds the limit oracle_madds = 10000000000" 10 -- \
      "$bin" run "$tmp/a.toml" --no-trace
    expect 2 "batching.epochs: the oracle's estimated" 10 -- \
      "$bin" certify "$tmp/a.toml" --trace "$tmp"
    ;;
  epochs_huge)  # used to hang, memory growing; --steps 1 must be cheap
    scenario "$tmp/a.toml" "[4, 8, 2]" "samples = 64
seed = 1" "micro_batch = 4
accumulation = 2
epochs = 1000000000000"
    expect 2 "^accumcheck: $tmp/a.toml:14:10: batching.epochs: batching.epochs = 1000000000000 x 8 windows per epoch = 8000000000000 optimizer windows exceeds the limit windows = 1000000" 10 -- \
      "$bin" run "$tmp/a.toml" --no-trace
    expect 0 'verdict \(oracle, 50 digits\): holds' 20 -- \
      "$bin" run "$tmp/a.toml" --steps 1 --out "$tmp/out"
    # One window in the trace: the correct run stopped with the reference.
    [ "$(grep -c '^correct,.*,optimizer_step' "$tmp/out/events.csv")" = 1 ] ||
      fail "expected one optimizer step of the correct run"
    # export and certify bound their work the same way (max_steps).
    sed -i 's/^epochs = .*/&\nmax_steps = 3/' "$tmp/a.toml"
    expect 0 'exported a' 20 -- "$bin" export "$tmp/a.toml" --out "$tmp/bundle"
    [ "$(tail -n +2 "$tmp/bundle/batches.csv" | cut -d, -f1 | sort -u | wc -l)" = 2 ] ||
      fail "batches.csv should hold the 2 epochs around max_steps"
    ;;
  ramp_epochs_huge)  # a ramp rule used to store one K per epoch (10^12) at parse
    scenario "$tmp/a.toml" "[4, 8, 2]" "samples = 64
seed = 1" "micro_batch = 4
accumulation = { start = 1, step = 1, max = 4611686018427387904 }
epochs = 1000000000000"
    expect 2 'batching.epochs = 1000000000000 x 16 windows per epoch = 16000000000000 optimizer windows exceeds the limit windows' 10 -- \
      "$bin" run "$tmp/a.toml" --no-trace
    expect 0 'K=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,\.\.\. \(min\(1\+1e,4611686018427387904\)\)' 20 -- \
      "$bin" run "$tmp/a.toml" --steps 3 --no-trace
    # export writes the rule back, not 10^12 entries, and reads it again.
    sed -i 's/^epochs = .*/&\nmax_steps = 3/' "$tmp/a.toml"
    expect 0 'exported a' 20 -- "$bin" export "$tmp/a.toml" --out "$tmp/bundle"
    grep -q '^accumulation = { start = 1, step = 1, max = 4611686018427387904 }$' \
      "$tmp/bundle/scenario.toml" || fail "the bundle's scenario.toml lost the ramp rule"
    ;;
  epochs_int64max)
    scenario "$tmp/a.toml" "[4, 8, 2]" "samples = 64" "micro_batch = 4
accumulation = 2
epochs = 9223372036854775807"
    expect 2 "^accumcheck: $tmp/a.toml:13:10: batching.epochs: batching.epochs = 9223372036854775807 x 8 windows per epoch = \\(overflow\\) optimizer windows: too large, its optimizer windows do not fit in 63 bits" 10 -- \
      "$bin" run "$tmp/a.toml" --no-trace
    expect 0 'holds' 20 -- "$bin" run "$tmp/a.toml" --steps 2 --no-trace
    ;;
  at_step_beyond)  # used to be "relative distance nan at window 100", exit 1
    scenario "$tmp/a.toml" "[4, 8, 2]" "samples = 64" "micro_batch = 4
accumulation = 2
epochs = 2" '
[trainer]
pitfalls = ["zero-grad-every-micro-step"]

[expect]
verdict = "diverges-from-reference"
min_distance = 0.01
at_step = 100'
    expect 2 'a.toml:[0-9]+:[0-9]+: expect.at_step: expected a window in 0..15 \(the run has 16 windows' -- \
      "$bin" run "$tmp/a.toml" --out "$tmp/out"
    [ ! -e "$tmp/out" ] || fail "a trace was written"
    sed -i 's/at_step = 100/at_step = 10/' "$tmp/a.toml"
    expect 2 'expect.at_step: window 10 is beyond this run.s 4 windows \(--steps 4\)' -- \
      "$bin" run "$tmp/a.toml" --steps 4 --out "$tmp/out"
    [ ! -e "$tmp/out" ] || fail "a trace was written"
    ;;
  out_is_file)  # used to be exit 3
    echo x >"$tmp/file"
    expect 2 'file: --out: exists and is not a folder' -- \
      "$bin" run "$src/scenarios/correct.toml" --out "$tmp/file"
    expect 2 '--out: cannot create this folder: .*/file on its path is a file' -- \
      "$bin" run "$src/scenarios/correct.toml" --out "$tmp/file/sub/dir"
    expect 2 '--out: exists and is not a folder' -- \
      "$bin" export "$src/scenarios/certify-mlp.toml" --out "$tmp/file"
    expect 2 '--out: cannot create this folder' -- \
      "$bin" check --property zero-grad --cases 1 --out "$tmp/file/x"
    [ "$(cat "$tmp/file")" = x ] || fail "the file was overwritten"
    ;;
  scenario_path_missing)  # the README's scenarios/X.toml outside a clone said only "cannot open file"
    expect 2 "$tmp/elsewhere/scenarios/correct.toml does not exist; accumcheck's scenario correct is at .*/correct.toml: name it \\(correct\\)" -- \
      "$bin" run "$tmp/elsewhere/scenarios/correct.toml" --quiet --no-trace
    expect 2 "name it \\(certify-mlp\\)" -- "$bin" export "$tmp/certify-mlp.toml" --out "$tmp/b"
    out=$("$bin" run "$tmp/no-such-scenario.toml" 2>&1)
    echo "$out" | grep -q "name it" && fail "a hint for a file that is no scenario of accumcheck's"
    ;;
  out_not_writable)
    [ "$(id -u)" = 0 ] && { echo "SKIP: root can write anywhere"; exit 0; }
    mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
    expect 2 '--out: cannot create or write this folder' -- \
      "$bin" run "$src/scenarios/correct.toml" --out "$tmp/ro/x"
    ;;
  junit_missing_folder)  # used to print PASS, then exit 3
    make_trace
    expect 0 'PASS' -- "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" \
      --run correct --junit "$tmp/new/folder/r.xml"
    grep -q '<testsuite ' "$tmp/new/folder/r.xml" || fail "no JUnit file"
    echo x >"$tmp/file"
    expect 2 'file: --junit: exists and is not a folder' -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct \
      --junit "$tmp/file/r.xml"
    expect 2 '--junit: is a folder, expected a file name' -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct \
      --junit "$tmp"
    ;;
  numeric_options)  # --seed -1 used to become 2^64-1
    expect 2 '--seed: expected an integer in 0..18446744073709551615, got -1' -- \
      "$bin" check --seed -1 --list
    expect 2 '--steps' -- "$bin" run "$src/scenarios/correct.toml" --steps -5
    expect 2 '--digits' -- "$bin" run "$src/scenarios/correct.toml" --digits 5
    expect 2 '--cases' -- "$bin" check --cases 0 --list
    expect 2 '--top' -- "$bin" certify "$src/scenarios/correct.toml" \
      --trace "$tmp" --top 0
    expect 2 '--rows' -- "$bin" run "$src/scenarios/correct.toml" --rows -1
    ;;
  csv_dev_zero)  # used to read 1.2 GB for 45 s
    scenario "$tmp/a.toml" "[2, 4, 1]" 'csv = "/dev/zero"' "micro_batch = 2
accumulation = 2"
    expect 2 "a.toml:8:7: data.csv: expected a CSV file, got '/dev/zero': /dev/zero is not a regular file" 5 -- \
      "$bin" run "$tmp/a.toml" --no-trace
    ;;
  csv_missing)  # used to name the CSV path only, not the scenario's line and key
    scenario "$tmp/a.toml" "[2, 4, 1]" 'csv = "nope.csv"' "micro_batch = 2
accumulation = 2"
    expect 2 "^accumcheck: $tmp/a.toml:8:7: data.csv: expected a CSV file, got 'nope.csv': $tmp/nope.csv does not exist" -- \
      "$bin" run "$tmp/a.toml" --out "$tmp/out"
    mkdir "$tmp/d.csv"
    sed -i 's/nope\.csv/d.csv/' "$tmp/a.toml"
    expect 2 "^accumcheck: $tmp/a.toml:8:7: data.csv: expected a CSV file, got 'd.csv': $tmp/d.csv is a folder" -- \
      "$bin" export "$tmp/a.toml" --out "$tmp/out"
    [ ! -e "$tmp/out" ] || fail "a refused scenario left output behind"
    ;;
  csv_size_limit)  # a CSV over csv_bytes is refused before it is read
    { echo "x0,x1,y0"; for i in $(seq 200); do echo "0.5,0.25,1"; done; } >"$tmp/d.csv"
    scenario "$tmp/a.toml" "[2, 4, 1]" 'csv = "d.csv"' "micro_batch = 2
accumulation = 2"
    ACCUMCHECK_LIMITS=csv_bytes=1000 expect 2 'd.csv: its size 2209 bytes exceeds the limit csv_bytes = 1000 bytes .*ACCUMCHECK_LIMITS=csv_bytes=N' -- \
      "$bin" run "$tmp/a.toml" --no-trace
    expect 0 'holds' -- "$bin" run "$tmp/a.toml" --no-trace
    ;;
  limits_env)  # the documented way to raise (or lower) a limit
    scenario "$tmp/a.toml" "[4, 8, 2]" "samples = 64" "micro_batch = 4
accumulation = 2"
    ACCUMCHECK_LIMITS=samples=32 expect 2 'data.samples = 64 exceeds the limit samples = 32 samples' -- \
      "$bin" run "$tmp/a.toml" --no-trace
    ACCUMCHECK_LIMITS="samples=1e2, windows=100" expect 0 'holds' -- \
      "$bin" run "$tmp/a.toml" --no-trace
    ACCUMCHECK_LIMITS=sample=5 expect 2 'ACCUMCHECK_LIMITS: sample: expected key=value with a key among' -- \
      "$bin" run "$tmp/a.toml" --no-trace
    ACCUMCHECK_LIMITS=samples=-3 expect 2 'ACCUMCHECK_LIMITS: samples: expected an integer >= 1' -- \
      "$bin" run "$tmp/a.toml" --no-trace
    expect 0 'oracle_madds +10000000000 \(1e10\)' -- "$bin" limits
    ;;
  events_step_huge)  # used to be bad_alloc (1e9) or 38 s, 2.1 GB, FAIL (5e7)
    make_trace
    only_run correct "$tmp/tr/events.csv"
    only_run correct "$tmp/tr/values.csv"
    for big in 1000000000 50000000; do
      cp -r "$tmp/tr" "$tmp/t2"
      # The last row (an earlier one is caught as steps out of order).
      line=$(wc -l <"$tmp/t2/events.csv")
      awk -F, -v OFS=, -v l="$line" -v b="$big" 'NR == l {$3 = b} 1' \
        "$tmp/t2/events.csv" >"$tmp/e" && mv "$tmp/e" "$tmp/t2/events.csv"
      reseal "$tmp/t2"
      expect 2 "events.csv:$line: step: run 'correct': (step|optimizer_step) $big(, but 6 optimizer_step rows precede this row| follows optimizer_step 5)" 10 -- \
        "$bin" certify "$tmp/s.toml" --trace "$tmp/t2"
      rm -rf "$tmp/t2"
    done
    ;;
  events_duplicate_gap)  # used to be judged as trainer behaviour (exit 1)
    make_trace
    only_run correct "$tmp/tr/events.csv"
    only_run correct "$tmp/tr/values.csv"
    cp -r "$tmp/tr" "$tmp/dup"
    # Repeat the first optimizer_step row.
    awk -F, '{print} $5 == "optimizer_step" && !d {print; d = 1}' \
      "$tmp/tr/events.csv" >"$tmp/dup/events.csv"
    reseal "$tmp/dup"
    line=$(awk -F, '$5 == "optimizer_step" {n++} n == 2 {print NR; exit}' "$tmp/dup/events.csv")
    expect 2 "events.csv:$line: step: run 'correct': optimizer_step 0 appears twice" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/dup"
    cp -r "$tmp/tr" "$tmp/gap"
    # Drop the second optimizer_step row: step 2 follows step 0.
    awk -F, '$5 == "optimizer_step" && ++n == 2 {next} 1' \
      "$tmp/tr/events.csv" >"$tmp/gap/events.csv"
    reseal "$tmp/gap"
    expect 2 "events.csv:[0-9]+: step: run 'correct': step 2, but 1 optimizer_step rows precede this row" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/gap"
    cp -r "$tmp/tr" "$tmp/short"
    # events end early: fewer optimizer_step rows than values steps.
    awk -F, '$5 == "optimizer_step" && ++n == 3 {exit} 1' \
      "$tmp/tr/events.csv" >"$tmp/short/events.csv"
    reseal "$tmp/short"
    expect 2 "events.csv:[0-9]+: step: run 'correct': 2 optimizer_step rows, but values.csv holds 6 steps" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/short"
    ;;
  events_missing)  # used to PASS ("call pattern NOT checked") without a flag
    make_trace
    only_run correct "$tmp/tr/values.csv"
    cp "$tmp/tr/events.csv" "$tmp/ev"
    head -1 "$tmp/ev" >"$tmp/tr/events.csv"  # header only
    reseal "$tmp/tr"
    # A recorder always writes events: refused, nothing written ...
    expect 2 "events.csv:1: run: no rows for run 'correct' \(the file holds no rows\); expected its events .* or --values-only" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --junit "$tmp/r.xml"
    [ ! -e "$tmp/r.xml" ] || fail "a refused trace left a JUnit report"
    # ... unless values-only judging is asked for, and then said.
    expect 0 "^PASS: .*; call pattern NOT checked: events.csv has no rows for run 'correct'" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --junit "$tmp/r.xml" --values-only
    grep -q '<skipped message="call pattern NOT checked' "$tmp/r.xml" ||
      fail "the JUnit report does not say the check was skipped"
    only_run reference "$tmp/ev"  # rows of another run only
    cp "$tmp/ev" "$tmp/tr/events.csv"
    reseal "$tmp/tr"
    last=$(wc -l <"$tmp/tr/events.csv")
    expect 2 "events.csv:$last: run: no rows for run 'correct' \(the file holds rows of run 'reference' only\)" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct --quiet
    expect 0 "call pattern NOT checked: events.csv has no rows for run 'correct'" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct --quiet --values-only
    expect 2 "--values-only: applies to a scenario's trace, not to --contract" -- \
      "$bin" certify --contract --trace "$tmp/tr" --values-only
    # A run with optimizer steps in events.csv but no values is refused.
    make_trace
    only_run correct "$tmp/tr/events.csv"
    only_run reference "$tmp/tr/values.csv"
    expect 2 "events.csv:[0-9]+: step: run 'correct': optimizer_step 0 has no values: values.csv holds no steps of this run" -- \
      "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct
    ;;
  export_csv)  # the bundle's scenario.toml used to name a CSV left behind
    mkdir "$tmp/src"
    { echo "x0,x1,y0"; for i in $(seq 24); do echo "0.$i,-0.5,0.25"; done; } >"$tmp/src/d.csv"
    scenario "$tmp/src/a.toml" "[2, 4, 1]" 'csv = "d.csv"' "micro_batch = 4
accumulation = 2
epochs = 2"
    expect 0 'scenario-data.csv' -- "$bin" export "$tmp/src/a.toml" --out "$tmp/bundle"
    cmp -s "$tmp/src/d.csv" "$tmp/bundle/scenario-data.csv" || fail "CSV not copied"
    grep -q '^csv = "scenario-data.csv"' "$tmp/bundle/scenario.toml" ||
      fail "scenario.toml does not name the copy"
    digest=$(awk -F, '$1 == "scenario_digest" {print $2}' "$tmp/bundle/hyperparameters.csv")
    rm -rf "$tmp/src"  # the bundle stands alone
    # A trainer's trace on the bundle (here accumcheck's own), certified.
    expect 0 'holds' -- "$bin" run "$tmp/bundle/scenario.toml" --engine device --quiet --out "$tmp/tr"
    grep -q "scenario_digest,$digest" "$tmp/tr/meta.csv" || fail "digest differs"
    expect 0 '^PASS' -- "$bin" certify "$tmp/bundle/scenario.toml" --trace "$tmp/tr" --run correct
    ;;
  certify_progress)  # certify's progress line: on a terminal only, erased
    make_trace
    cert="'$bin' certify '$tmp/s.toml' --trace '$tmp/tr' --run correct"
    script -qec "$cert" /dev/null >"$tmp/tty.out" 2>&1 ||
      fail "certify on a terminal (script -qec) did not pass"
    grep -Eq 'certify: judging: step [0-9]+ of [0-9]+' "$tmp/tty.out" ||
      fail "no progress line on a terminal: $(cat -v "$tmp/tty.out" | head -c 300)"
    tr '\r' '\n' <"$tmp/tty.out" | grep -Eq '^certify [^ ]+: run .correct.' ||
      fail "the report does not start at the line's beginning: $(cat -v "$tmp/tty.out" | head -c 600)"
    script -qec "$cert --quiet" /dev/null >"$tmp/quiet.out" 2>&1
    grep -Eq 'step [0-9]+ of' "$tmp/quiet.out" && fail "a progress line under --quiet"
    "$bin" certify "$tmp/s.toml" --trace "$tmp/tr" --run correct \
      >"$tmp/pipe.out" 2>&1 || fail "certify did not pass"
    grep -Eq 'step [0-9]+ of' "$tmp/pipe.out" && fail "a progress line without a terminal"
    grep -q '^PASS' "$tmp/pipe.out" || fail "no PASS"
    ;;
  *) fail "unknown case" ;;
esac
echo "ok [$case_name]"
