// Trace reading (verify/trace/trace.hpp): read_trace reads meta.csv,
// events.csv, then values.csv or values.bin, each by its own reader
// (verify/trace/read_csv.hpp, values_bin.hpp).  The values checked
// against a scenario's model are verify/trace/validate.cpp; state.csv and
// contract.csv are read_state.cpp and read_contract.cpp.
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "sim/errors.hpp"
#include "verify/trace/read_csv.hpp"
#include "verify/trace/trace.hpp"
#include "verify/trace/values_bin.hpp"

namespace accumcheck {

std::string Trace::meta_value(std::string_view key) const {
  for (const auto& [k, v] : meta)
    if (k == key) return v;
  return "";
}

const TraceRun* Trace::run(std::string_view name) const {
  for (const TraceRun& r : runs)
    if (r.name == name) return &r;
  return nullptr;
}

std::string Trace::events_path() const {
  return (std::filesystem::path(dir) / "events.csv").string();
}
std::string Trace::values_path() const {
  if (binary) return binary->path;
  return (std::filesystem::path(dir) / "values.csv").string();
}
std::string Trace::meta_path() const {
  return (std::filesystem::path(dir) / "meta.csv").string();
}

Trace read_trace(const std::string& dir) {
  Trace t;
  t.dir = dir;
  trace_detail::refuse_incomplete_ranks(dir);
  check_complete(dir);
  trace_detail::read_meta(t);
  trace_detail::RunTracker runs{t, {}, {}, {}, true};
  trace_detail::read_events(t, runs);

  const std::string bin_path =
      (std::filesystem::path(dir) / "values.bin").string();
  std::error_code ec;
  if (std::filesystem::exists(bin_path, ec)) {
    if (std::filesystem::exists(t.values_path(), ec))
      throw InputError(bin_path, 0, 0, "",
                       "the trace holds both values.csv and values.bin; a "
                       "trace holds one or the other");
    trace_detail::read_values_bin(t, bin_path);
    return t;
  }
  runs.closed.clear();
  runs.first = true;
  trace_detail::read_values_csv(t, runs);
  return t;
}

}  // namespace accumcheck
