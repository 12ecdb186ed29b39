# Sourced by scripts/check-hardened.sh and scripts/fuzz.sh: sanitizer
# reports are fatal, leaks are reported at exit (LeakSanitizer), and the
# suppressions (each with its reason) live in .ci/lsan.supp.
# Stack-use-after-return detection is not set here: the GoogleTest binary
# turns it on for itself (tests/asan_defaults.cpp says why the command-line
# processes run without it).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/.ci/lsan.supp:print_suppressions=0"
