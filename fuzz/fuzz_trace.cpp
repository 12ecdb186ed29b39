// libFuzzer target: the trace reader (verify/trace/trace.hpp), read_trace,
// gather_steps and read_state.
//
// One input is the files of a trace folder joined by a line
// "--accumcheck-fuzz--" (meta.csv, events.csv, values.csv, values.bin;
// missing parts are empty files), so mutations reach every file.  A
// non-empty fourth part is written as values.bin in place of values.csv
// (the binary values file, verify/trace/values_bin.cpp).  The seed corpus
// (fuzz/corpus/trace) holds real traces written by `accumcheck run
// tests/data/tiny_mse.toml --out DIR` (oracle and device engines).  A bad
// trace must be an InputError; anything else is a crash.  Every run is
// gathered against the layout of that scenario's model (linear 2-1), with
// its state blocks (tiny_mse-oracle-bin-state.trace: that trace's
// values.bin as version 2, with exp_avg, exp_avg_sq and ema blocks).  The
// folder is sealed (complete.csv) before it is read: the completion check
// itself is tests/trace_test.cpp's and the damaged-trace battery's.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "fuzz/fuzz_files.hpp"
#include "sim/errors.hpp"
#include "sim/layout.hpp"
#include "verify/trace/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accumcheck;
  static const fuzz::ScratchDir dir;
  static const ParamLayout layout = [] {
    ModelSpec m;
    m.widths = {2, 1};
    return layout_of(m);
  }();
  static constexpr std::string_view kSep = "--accumcheck-fuzz--\n";
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::string_view part[4];
  for (int i = 0; i < 4; ++i) {
    const size_t at = i < 3 ? rest.find(kSep) : std::string_view::npos;
    part[i] = rest.substr(0, at);
    rest = at == std::string_view::npos ? std::string_view()
                                        : rest.substr(at + kSep.size());
  }
  dir.write("meta.csv", part[0]);
  dir.write("events.csv", part[1]);
  std::error_code ec;
  if (part[3].empty()) {
    std::filesystem::remove(dir.path() + "/values.bin", ec);
    dir.write("values.csv", part[2]);
  } else {
    std::filesystem::remove(dir.path() + "/values.csv", ec);
    dir.write("values.bin", part[3]);
  }
  try {
    // Sealed as written (complete.csv), so mutations reach the readers
    // past the completion record.
    seal_trace(dir.path());
    const Trace t = read_trace(dir.path());
    for (const TraceRun& run : t.runs) {
      (void)gather_steps(t, run, layout);
      (void)read_state(t, run, layout);  // values.bin's state blocks
    }
  } catch (const InputError&) {
  }
  return 0;
}
