// AddressSanitizer's defaults for the GoogleTest binary (linked into it
// only in a sanitizer build, ACCUMCHECK_SANITIZE): stack-use-after-return
// detection on.  It gives every function call a frame on a heap "fake
// stack", which made the command-line tests (accumcheck run and certify
// processes: scenario runs, the PyTorch cases, the shell tests) 1.5-1.9x
// slower (certify-mlp-200's run 11.6 -> 17.1 s), so scripts/sanitizer-
// env.sh leaves it off for those and the unit and property tests, where
// every core function is called, keep it.  ASAN_OPTIONS from the
// environment is read after this and may still set it either way.
extern "C" const char* __asan_default_options();
extern "C" const char* __asan_default_options() {
  return "detect_stack_use_after_return=1";
}
