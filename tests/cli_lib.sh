# The helpers of the CLI test scripts (tests/hardening_cli.sh,
# tests/state_cli.sh), sourced by them with `case_name` set: a scratch
# folder $tmp removed on exit, fail and expect.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL [$case_name]: $*"; exit 1; }

# expect CODE REGEX [TIMEOUT] -- cmd...: the exit code is CODE and the
# output (stdout and stderr) matches the extended regex REGEX, within
# TIMEOUT seconds (default 60).
expect() {
  local code=$1 re=$2 limit=60
  shift 2
  if [ "$1" != "--" ]; then limit=$1; shift; fi
  shift
  local out rc
  out=$(timeout "$limit" "$@" 2>&1)
  rc=$?
  echo "\$ $* -> exit $rc"
  echo "$out" | head -c 3000
  echo
  [ "$rc" = "$code" ] || fail "exit code $rc, expected $code"
  echo "$out" | grep -Eq -- "$re" || fail "output does not match /$re/"
}

# reseal DIR: rewrites DIR/complete.csv (docs/trace-format.md) for the
# trace files DIR holds now, as a writer of its own would: for a case
# that edits a trace to reach certify's checks past the completion
# record's (which refuses any edit).
reseal() {
  local dir=$1 f n=0 rows
  {
    echo "file,rows,bytes,sha256"
    for f in meta.csv events.csv values.csv values.bin state.csv contract.csv schedule.csv; do
      [ -f "$dir/$f" ] || continue
      rows=""
      case $f in *.csv) rows=$(( $(wc -l <"$dir/$f") - 1 )) ;; esac
      echo "$f,$rows,$(stat -c %s "$dir/$f"),$(sha256sum "$dir/$f" | cut -d' ' -f1)"
      n=$((n + 1))
    done
    echo "complete.csv,$n,,"
  } >"$dir/complete.csv"
}
