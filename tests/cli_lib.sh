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
