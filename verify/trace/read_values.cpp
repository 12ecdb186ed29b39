// Trace reading: values.csv (verify/trace/read_csv.hpp); values.bin is
// verify/trace/values_bin.cpp.
#include <fmt/format.h>

#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "verify/trace/columns.hpp"
#include "verify/trace/read_csv.hpp"

namespace accumcheck::trace_detail {

void read_values_csv(Trace& t, RunTracker& runs) {
  CsvFile f(t.values_path(), kValuesHeader);
  Reader<7> r(f.bytes);
  f.read_header_flags(r, io::ignore_missing_column, kValuesHeader, "run",
                      "step", "kind", "tensor", "index", "value", "rank");
  for (std::string_view c : {"run", "step", "kind", "tensor", "index", "value"})
    if (!r.has_column(std::string(c)))
      f.fail(1, c,
             fmt::format("missing column '{}'; expected the header {}", c,
                         kValuesHeader));
  std::string run, kind, tensor;
  char *step = nullptr, *index = nullptr, *value = nullptr;
  char zero[] = "0";
  char* rank = zero;
  int64_t line = 0;
  // The rows of the current (run, step), to find duplicates.
  std::map<std::tuple<int64_t, ValueKind, std::string, int64_t>, int64_t> seen;
  const TraceRun* seen_run = nullptr;
  int64_t seen_step = -1;
  while (f.row(r, line, run, step, kind, tensor, index, value, rank)) {
    TraceRun& tr = runs.at(f, line, run);
    TraceValue v;
    v.line = line;
    v.step = f.integer(line, "step", step, 0);
    if (kind == "param")
      v.kind = ValueKind::param;
    else if (kind == "grad")
      v.kind = ValueKind::grad;
    else
      f.fail(line, "kind",
             fmt::format("unknown kind '{}'; expected param or grad", kind));
    if (tensor.empty()) f.fail(line, "tensor", "expected a tensor name");
    v.tensor = tensor;
    v.index = f.integer(line, "index", index, 0);
    v.value = f.real(line, "value", value);
    v.rank = f.integer(line, "rank", rank, 0);
    if (!tr.values.empty() && v.step < tr.values.back().step)
      f.fail(line, "step",
             fmt::format("steps out of order in run '{}': {} after {} "
                         "(line {})",
                         run, v.step, tr.values.back().step,
                         tr.values.back().line));
    if (seen_run != &tr || seen_step != v.step) {
      seen.clear();
      seen_run = &tr;
      seen_step = v.step;
    }
    const auto [it, fresh] =
        seen.emplace(std::make_tuple(v.rank, v.kind, v.tensor, v.index), line);
    if (!fresh)
      f.fail(
          line, "",
          fmt::format("duplicated row: run '{}' step {} {} {}[{}] rank "
                      "{} was given at line {}",
                      run, v.step, kind, tensor, v.index, v.rank, it->second));
    tr.values.push_back(std::move(v));
  }
}

}  // namespace accumcheck::trace_detail
