# Sourced by scripts/build.sh and scripts/check-hardened.sh.
# build_quiet DIR JOBS: builds DIR, printing what the compiler says
# (warnings, errors) but not the progress lines, and fails with the build's
# own exit status.  (A `cmake --build | grep` pipeline under pipefail must
# not hide a failed build: the exit status is taken from PIPESTATUS inside
# the same `||`, before any other command resets it.)
build_quiet() {
  local status=0
  cmake --build "$1" -j"$2" 2>&1 \
    | grep -vE '^\[ *[0-9]+%\]|^(Consolidate|Scanning|Built target)' \
    || status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    echo "build of $1 failed (exit $status)" >&2
    return "$status"
  fi
}
