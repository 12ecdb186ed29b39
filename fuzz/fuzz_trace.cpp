// libFuzzer target: the trace reader (verify/trace.hpp), read_trace and
// gather_steps.
//
// One input is the three files of a trace folder joined by a line
// "--accumcheck-fuzz--" (meta.csv, events.csv, values.csv; missing parts
// are empty files), so mutations reach every file.  The seed corpus
// (fuzz/corpus/trace) holds real traces written by `accumcheck run
// tests/data/tiny_mse.toml --out DIR` (oracle and device engines).  A bad
// trace must be an InputError; anything else is a crash.  Every run is
// gathered against the layout of that scenario's model (linear 2-1).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_files.hpp"
#include "sim/errors.hpp"
#include "sim/layout.hpp"
#include "verify/trace.hpp"

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
  std::string_view part[3];
  for (int i = 0; i < 3; ++i) {
    const size_t at = i < 2 ? rest.find(kSep) : std::string_view::npos;
    part[i] = rest.substr(0, at);
    rest = at == std::string_view::npos ? std::string_view()
                                        : rest.substr(at + kSep.size());
  }
  dir.write("meta.csv", part[0]);
  dir.write("events.csv", part[1]);
  dir.write("values.csv", part[2]);
  try {
    const Trace t = read_trace(dir.path());
    for (const TraceRun& run : t.runs) (void)gather_steps(t, run, layout);
  } catch (const InputError&) {
  }
  return 0;
}
