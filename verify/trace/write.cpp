// Trace writing (verify/trace/trace.hpp): TraceWriter and write_trace.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/atomic_file.hpp"
#include "verify/trace/columns.hpp"
#include "verify/trace/trace.hpp"

#ifndef ACCUMCHECK_VERSION
#error "ACCUMCHECK_VERSION comes from verify/trace/CMakeLists.txt"
#endif

namespace accumcheck {

namespace {

// A text field: double-quoted when it holds the separator, a quote, or
// edge whitespace (which the reader would trim).  Line breaks cannot be
// represented in a line-based CSV and are refused.
void check_field(std::string_view s) {
  if (s.find_first_of("\n\r") != std::string_view::npos)
    throw std::invalid_argument(
        fmt::format("trace field holds a line break: '{}'", s));
}

void append_field(std::string& out, std::string_view s) {
  check_field(s);
  const bool quote = s.find_first_of(",\"") != std::string_view::npos ||
                     (!s.empty() && (s.front() == ' ' || s.front() == '\t' ||
                                     s.back() == ' ' || s.back() == '\t'));
  if (!quote) {
    out += s;
    return;
  }
  out += '"';
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

// 17 significant digits read back exactly; NaN is the empty field.
void append_real(std::string& out, double x) {
  if (std::isnan(x)) return;
  fmt::format_to(std::back_inserter(out), "{:.17g}", x);
}

}  // namespace

std::string_view value_kind_name(ValueKind k) {
  return k == ValueKind::param ? "param" : "grad";
}

TraceWriter::TraceWriter(std::string scenario_name, std::string scenario_digest,
                         std::string engine, std::string precision,
                         std::string tool_version) {
  meta_ = {{"schema", std::string(kTraceSchema)},
           {"scenario", std::move(scenario_name)},
           {"scenario_digest", std::move(scenario_digest)},
           {"engine", std::move(engine)},
           {"precision", std::move(precision)},
           {"tool_version", tool_version.empty() ? ACCUMCHECK_VERSION
                                                 : std::move(tool_version)}};
  events_ = std::string(trace_detail::kEventsHeader) + "\n";
  values_ = std::string(trace_detail::kValuesHeader) + "\n";
}

void TraceWriter::with_ranks() {
  if (!runs_.empty())
    throw std::logic_error("TraceWriter::with_ranks after the first run");
  if (ranks_) return;
  ranks_ = true;
  events_ = std::string(trace_detail::kEventsHeader) + ",rank\n";
  values_ = std::string(trace_detail::kValuesHeader) + ",rank\n";
}

void TraceWriter::add_meta(std::string key, std::string value) {
  for (const auto& [k, v] : meta_)
    if (k == key)
      throw std::invalid_argument("trace meta key '" + key + "' set twice");
  check_field(key);
  check_field(value);
  meta_.emplace_back(std::move(key), std::move(value));
}

std::string TraceWriter::meta_csv() const {
  std::string o = std::string(trace_detail::kMetaHeader) + "\n";
  for (const auto& [k, v] : meta_) {
    append_field(o, k);
    o += ',';
    append_field(o, v);
    o += '\n';
  }
  return o;
}

void TraceWriter::begin_run(std::string_view name) {
  if (name.empty()) throw std::invalid_argument("trace run without a name");
  check_field(name);
  if (std::find(runs_.begin(), runs_.end(), name) != runs_.end())
    throw std::invalid_argument(
        fmt::format("trace run '{}' added twice", name));
  runs_.emplace_back(name);
}

void TraceWriter::add_event(const Event& e) {
  if (runs_.empty()) throw std::logic_error("add_event before begin_run");
  std::string& o = events_;
  append_field(o, runs_.back());
  fmt::format_to(std::back_inserter(o), ",{},{},{},{},{},{},", e.epoch, e.step,
                 e.micro, event_name(e.kind), e.samples, e.tokens);
  append_real(o, e.loss);
  o += ',';
  append_real(o, e.lr);
  o += ',';
  append_real(o, e.grad_norm);
  o += ',';
  for (size_t i = 0; i < e.sample_ids.size(); ++i)
    fmt::format_to(std::back_inserter(o), "{}{}", i ? " " : "",
                   e.sample_ids[i]);
  if (ranks_) fmt::format_to(std::back_inserter(o), ",{}", e.rank);
  o += '\n';
}

void TraceWriter::add_value(int64_t step, ValueKind kind,
                            std::string_view tensor, int64_t index,
                            double value, int64_t rank) {
  if (runs_.empty()) throw std::logic_error("add_value before begin_run");
  if (rank != 0 && !ranks_)
    throw std::logic_error("add_value of rank > 0 without with_ranks()");
  std::string& o = values_;
  append_field(o, runs_.back());
  fmt::format_to(std::back_inserter(o), ",{},{},", step, value_kind_name(kind));
  append_field(o, tensor);
  fmt::format_to(std::back_inserter(o), ",{},", index);
  append_real(o, value);
  if (ranks_) fmt::format_to(std::back_inserter(o), ",{}", rank);
  o += '\n';
}

void TraceWriter::add_state(std::string_view kind, int64_t step,
                            std::string_view tensor, int64_t index,
                            double value) {
  if (runs_.empty()) throw std::logic_error("add_state before begin_run");
  std::string& o = state_;
  append_field(o, runs_.back());
  o += ',';
  append_field(o, kind);
  fmt::format_to(std::back_inserter(o), ",{},", step);
  append_field(o, tensor);
  fmt::format_to(std::back_inserter(o), ",{},", index);
  append_real(o, value);
  o += '\n';
}

std::string TraceWriter::state_csv() const {
  return state_.empty()
             ? std::string()
             : std::string(trace_detail::kStateHeader) + "\n" + state_;
}

void write_trace(const std::string& dir, const TraceWriter& w) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);  // throws filesystem_error on failure
  const fs::path d(dir);
  // An earlier trace's record goes first: a write that stops half-way
  // leaves a trace without one (refused), never one that vouches for
  // another run's files.  The record last, once every file is written.
  fs::remove(d / kCompleteFile);  // throws on failure
  const std::string state = w.state_csv(), meta = w.meta_csv();
  std::vector<std::pair<std::string, std::string_view>> files = {
      {"events.csv", w.events_csv()}, {"values.csv", w.values_csv()}};
  if (!state.empty()) files.emplace_back("state.csv", state);
  files.emplace_back("meta.csv", meta);
  // Files an earlier trace in the folder had and this one has not.
  for (const char* stale :
       {"state.csv", "values.bin", "contract.csv", "schedule.csv"})
    if (std::none_of(files.begin(), files.end(),
                     [&](const auto& f) { return f.first == stale; }))
      fs::remove(d / stale);  // throws on failure
  for (const auto& [name, bytes] : files)
    write_file_atomically((d / name).string(), bytes);
  write_file_atomically((d / kCompleteFile).string(), complete_csv(files));
}

}  // namespace accumcheck
