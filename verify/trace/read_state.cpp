// Trace reading: state.csv (verify/trace/trace.hpp StateSection), and
// a values.bin trace's state blocks (verify/trace/values_bin.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <string>
#include <string_view>

#include "verify/trace/columns.hpp"
#include "verify/trace/read_csv.hpp"
#include "verify/trace/trace.hpp"
#include "verify/trace/values_bin.hpp"

namespace accumcheck {

StateSection read_state(const std::string& dir, std::string_view run) {
  using trace_detail::CsvFile, trace_detail::Reader, trace_detail::kStateHeader,
      trace_detail::kStateKinds;
  StateSection st;
  st.path = (std::filesystem::path(dir) / "state.csv").string();
  if (!std::filesystem::exists(st.path)) return st;
  st.present = true;
  CsvFile f(st.path, kStateHeader);
  Reader<6> r(f.bytes);
  f.read_header_flags(r, io::ignore_missing_column, kStateHeader, "run", "kind",
                      "step", "tensor", "index", "value");
  for (std::string_view c : {"kind", "step", "tensor", "index", "value"})
    if (!r.has_column(std::string(c)))
      f.fail(1, c,
             fmt::format("missing column '{}'; expected the header {} (run "
                         "optional)",
                         c, kStateHeader));
  const bool runs = r.has_column("run");
  std::string name, kind, tensor;
  char *step = nullptr, *index = nullptr, *value = nullptr;
  int64_t line = 0;
  while (f.row(r, line, name, kind, step, tensor, index, value)) {
    if (runs && name.empty()) f.fail(line, "run", "expected a run name");
    if (std::find(std::begin(kStateKinds), std::end(kStateKinds), kind) ==
        std::end(kStateKinds))
      f.fail(line, "kind",
             fmt::format("unknown kind '{}'; expected one of loss_scale, "
                         "skipped, opt_step, exp_avg, exp_avg_sq, "
                         "ema_update, ema, running_mean, running_var, "
                         "num_batches_tracked, logged_loss",
                         kind));
    StateValue v;
    v.run = runs ? name : std::string(run);
    v.kind = kind;
    v.tensor = tensor;
    v.step = f.integer(line, "step", step, 0);
    v.index = f.integer(line, "index", index, 0);
    v.value = f.real(line, "value", value);
    v.line = line;
    if (v.run == run) st.rows.push_back(std::move(v));
  }
  return st;
}

StateSection read_state(const Trace& t, const TraceRun& run,
                        const ParamLayout& layout) {
  StateSection st = read_state(t.dir, run.name);
  trace_detail::gather_state_blocks(t, run, layout, st);
  return st;
}

}  // namespace accumcheck
