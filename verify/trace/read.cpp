// Trace writing and reading (verify/trace/trace.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <tuple>

#include "sim/atomic_file.hpp"
#include "sim/csv_lines.hpp"
#include "sim/errors.hpp"
#include "verify/trace/trace.hpp"
#include "verify/trace/values_bin.hpp"

#ifndef ACCUMCHECK_VERSION
#define ACCUMCHECK_VERSION "unknown"
#endif

namespace accumcheck {

namespace {

// The rank column, last, is optional (TraceWriter::with_ranks) in both
// files.
constexpr std::string_view kEventsHeader =
    "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,sample_ids";
constexpr std::string_view kEventsHeaderV1 =
    "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm";
constexpr std::string_view kValuesHeader = "run,step,kind,tensor,index,value";
constexpr std::string_view kMetaHeader = "key,value";
// state.csv; the run column is optional when read (read_state).
constexpr std::string_view kStateHeader = "run,kind,step,tensor,index,value";
constexpr std::string_view kStateKinds[] = {
    "loss_scale",  "skipped",
    "opt_step",    "exp_avg",
    "exp_avg_sq",  "ema_update",
    "ema",         "running_mean",
    "running_var", "num_batches_tracked",
    "logged_loss"};
constexpr std::string_view kRequiredMeta[] = {
    "schema", "scenario",  "scenario_digest",
    "engine", "precision", "tool_version"};

constexpr EventKind kEventKinds[] = {
    EventKind::zero_grad,      EventKind::forward_backward,
    EventKind::clip,           EventKind::optimizer_step,
    EventKind::scheduler_step, EventKind::all_reduce,
    EventKind::unscale,        EventKind::scaler_update,
    EventKind::ema_update};

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
  events_ = std::string(kEventsHeader) + "\n";
  values_ = std::string(kValuesHeader) + "\n";
}

void TraceWriter::with_ranks() {
  if (!runs_.empty())
    throw std::logic_error("TraceWriter::with_ranks after the first run");
  if (ranks_) return;
  ranks_ = true;
  events_ = std::string(kEventsHeader) + ",rank\n";
  values_ = std::string(kValuesHeader) + ",rank\n";
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
  std::string o = std::string(kMetaHeader) + "\n";
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
  return state_.empty() ? std::string()
                        : std::string(kStateHeader) + "\n" + state_;
}

void write_trace(const std::string& dir, const TraceWriter& w) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);  // throws filesystem_error on failure
  const fs::path d(dir);
  // meta last: a folder with a complete meta.csv has all its files of
  // this or a previous write.
  write_file_atomically((d / "events.csv").string(), w.events_csv());
  write_file_atomically((d / "values.csv").string(), w.values_csv());
  const std::string state = w.state_csv();
  if (state.empty())
    fs::remove(d / "state.csv");  // an earlier trace's (throws on failure)
  else
    write_file_atomically((d / "state.csv").string(), state);
  write_file_atomically((d / "meta.csv").string(), w.meta_csv());
}

// ---------------------------------------------------------------- reading

namespace {

using Quote = io::double_quote_escape<',', '"'>;
template <unsigned N>
using Reader = CsvTable<N, io::trim_chars<' ', '\t'>, Quote>;

// One CSV file held in memory, with the checks every trace file shares.
struct CsvFile {
  std::string path;
  std::string bytes;

  CsvFile(std::string p, std::string_view header) : path(std::move(p)) {
    bytes = read_file_bytes(path, "trace_bytes");
    if (bytes.empty())
      throw InputError(
          path, 1, 0, "",
          fmt::format("empty file; expected the header {}", header));
    if (bytes.back() != '\n') {
      const int64_t lines =
          int64_t(std::count(bytes.begin(), bytes.end(), '\n')) + 1;
      throw InputError(path, lines, 0, "",
                       "truncated file: the last line has no line end");
    }
  }

  [[noreturn]] void fail(int64_t line, std::string_view column,
                         const std::string& msg) const {
    throw InputError(path, line, 0, std::string(column), msg);
  }

  // `optional` columns may be missing (check r.has_column after).
  template <unsigned N, class... Names>
  void read_header(Reader<N>& r, std::string_view header,
                   Names... names) const {
    read_header_flags(r, io::ignore_no_column, header, names...);
  }
  template <unsigned N, class... Names>
  void read_header_flags(Reader<N>& r, io::ignore_column flags,
                         std::string_view header, Names... names) const {
    try {
      r.read_header(flags, names...);
    } catch (const io::error::missing_column_in_header& e) {
      fail(1, e.column_name,
           fmt::format("missing column '{}'; expected the header {}",
                       e.column_name, header));
    } catch (const io::error::extra_column_in_header& e) {
      fail(1, e.column_name,
           fmt::format("unknown column '{}'; expected the header {}",
                       e.column_name, header));
    } catch (const io::error::duplicated_column_in_header& e) {
      fail(1, e.column_name,
           fmt::format("column '{}' appears twice; expected the header {}",
                       e.column_name, header));
    } catch (const io::error::base& e) {
      fail(1, "", e.what());
    }
  }

  // Reads one row; false at the end.  Parser errors become InputErrors.
  template <unsigned N, class... Cols>
  bool row(Reader<N>& r, int64_t& line, Cols&... cols) const {
    try {
      const bool ok = r.read_row(cols...);
      line = int64_t(r.get_file_line());
      return ok;
    } catch (const io::error::too_few_columns&) {
      fail(int64_t(r.get_file_line()), "",
           fmt::format("too few columns; expected {}", N));
    } catch (const io::error::too_many_columns&) {
      fail(int64_t(r.get_file_line()), "",
           fmt::format("too many columns; expected {}", N));
    } catch (const io::error::escaped_string_not_closed&) {
      fail(int64_t(r.get_file_line()), "", "a quoted field is not closed");
    } catch (const io::error::base& e) {
      fail(int64_t(r.get_file_line()), "", e.what());
    }
  }

  int64_t integer(int64_t line, std::string_view column, std::string_view t,
                  int64_t lo) const {
    std::string_view s = t;
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() ||
        v < lo)
      fail(line, column,
           fmt::format("expected an integer >= {}, got '{}'", lo, t));
    return v;
  }

  // A float column: a number or inf, or empty for NaN; never "nan" text.
  double real(int64_t line, std::string_view column, std::string_view t) const {
    if (t.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::string_view s = t;
    if (s.front() == '+') s.remove_prefix(1);
    double v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() ||
        std::isnan(v))
      fail(line, column,
           fmt::format("expected a number (NaN is an empty field), got '{}'",
                       t));
    return v;
  }
};

// Finds or opens the run a row names; a run's rows must be contiguous.
struct RunTracker {
  Trace& trace;
  std::map<std::string, size_t, std::less<>> index;
  std::string current;
  std::set<std::string, std::less<>> closed;
  bool first = true;

  TraceRun& at(const CsvFile& f, int64_t line, const std::string& name) {
    if (name.empty()) f.fail(line, "run", "expected a run name, got ''");
    if (first || name != current) {
      if (closed.count(name))
        f.fail(line, "run",
               fmt::format("rows of run '{}' are split by another run's; "
                           "each run's rows must be contiguous",
                           name));
      if (!first) closed.insert(current);
      current = name;
      first = false;
    }
    auto it = index.find(name);
    if (it == index.end()) {
      it = index.emplace(name, trace.runs.size()).first;
      trace.runs.push_back(TraceRun{name, {}, {}, {}, {}});
    }
    return trace.runs[it->second];
  }
};

}  // namespace

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

  {  // meta.csv: the schema first of all.
    CsvFile f(t.meta_path(), kMetaHeader);
    Reader<2> r(f.bytes);
    f.read_header(r, kMetaHeader, "key", "value");
    std::string key, value;
    int64_t line = 0, schema_line = 0;
    while (f.row(r, line, key, value)) {
      if (key.empty()) f.fail(line, "key", "expected a key, got ''");
      for (const auto& [k, v] : t.meta)
        if (k == key)
          f.fail(line, key, fmt::format("meta key '{}' appears twice", key));
      if (key == "schema") schema_line = line;
      t.meta.emplace_back(key, value);
    }
    for (std::string_view k : kRequiredMeta)
      if (std::none_of(t.meta.begin(), t.meta.end(),
                       [&](const auto& kv) { return kv.first == k; }))
        f.fail(0, k, fmt::format("missing required meta key '{}'", k));
    if (t.meta_value("schema") != kTraceSchema &&
        t.meta_value("schema") != kTraceSchemaV1)
      f.fail(schema_line, "schema",
             fmt::format("schema version mismatch: expected '{}' (or '{}'), "
                         "got '{}'",
                         kTraceSchema, kTraceSchemaV1, t.meta_value("schema")));
  }

  RunTracker runs{t, {}, {}, {}, true};
  {  // events.csv (version 1: no sample_ids column)
    const bool v1 = t.meta_value("schema") == kTraceSchemaV1;
    const std::string_view header = v1 ? kEventsHeaderV1 : kEventsHeader;
    CsvFile f(t.events_path(), header);
    Reader<12> r(f.bytes);
    f.read_header_flags(r, io::ignore_missing_column, header, "run", "epoch",
                        "step", "micro", "event", "samples", "tokens", "loss",
                        "lr", "grad_norm", "sample_ids", "rank");
    for (std::string_view c : {"run", "epoch", "step", "micro", "event",
                               "samples", "tokens", "loss", "lr", "grad_norm"})
      if (!r.has_column(std::string(c)))
        f.fail(1, c,
               fmt::format("missing column '{}'; expected the header {}", c,
                           header));
    if (v1 && r.has_column("sample_ids"))
      f.fail(1, "sample_ids",
             fmt::format("column 'sample_ids' in a {} trace; expected the "
                         "header {}",
                         kTraceSchemaV1, header));
    if (!v1 && !r.has_column("sample_ids"))
      f.fail(1, "sample_ids",
             fmt::format("missing column 'sample_ids'; expected the header {}",
                         header));
    std::string run, event;
    char *epoch = nullptr, *step = nullptr, *micro = nullptr,
         *samples = nullptr, *tokens = nullptr, *loss = nullptr, *lr = nullptr,
         *norm = nullptr;
    char* ids = nullptr;
    char zero[] = "0";
    char* rank = zero;
    int64_t line = 0;
    while (f.row(r, line, run, epoch, step, micro, event, samples, tokens, loss,
                 lr, norm, ids, rank)) {
      TraceRun& tr = runs.at(f, line, run);
      TraceEvent te;
      te.line = line;
      Event& e = te.event;
      e.epoch = f.integer(line, "epoch", epoch, 0);
      e.step = f.integer(line, "step", step, 0);
      e.micro = f.integer(line, "micro", micro, -1);
      const auto* kind =
          std::find_if(std::begin(kEventKinds), std::end(kEventKinds),
                       [&](EventKind k) { return event_name(k) == event; });
      if (kind == std::end(kEventKinds))
        f.fail(line, "event",
               fmt::format("unknown event '{}'; expected zero_grad, "
                           "forward_backward, clip, optimizer_step, "
                           "scheduler_step, all_reduce, unscale, "
                           "scaler_update or ema_update",
                           event));
      e.kind = *kind;
      e.samples = f.integer(line, "samples", samples, 0);
      e.tokens = f.integer(line, "tokens", tokens, 0);
      e.loss = f.real(line, "loss", loss);
      e.lr = f.real(line, "lr", lr);
      e.grad_norm = f.real(line, "grad_norm", norm);
      e.rank = f.integer(line, "rank", rank, -1);
      if (ids != nullptr && *ids != '\0') {
        std::string_view rest(ids);
        while (!rest.empty()) {
          const size_t sp = rest.find(' ');
          const std::string_view tok = rest.substr(0, sp);
          e.sample_ids.push_back(f.integer(line, "sample_ids", tok, 0));
          rest = sp == std::string_view::npos ? std::string_view()
                                              : rest.substr(sp + 1);
        }
        if (e.kind != EventKind::forward_backward)
          f.fail(line, "sample_ids",
                 fmt::format("sample ids on a {} event; only forward_backward "
                             "events carry them",
                             event));
      }
      if (!tr.events.empty()) {
        const Event& prev = tr.events.back().event;
        if (e.epoch < prev.epoch)
          f.fail(line, "epoch",
                 fmt::format("epochs out of order in run '{}': {} after {} "
                             "(line {})",
                             run, e.epoch, prev.epoch, tr.events.back().line));
        if (e.step < prev.step)
          f.fail(line, "step",
                 fmt::format("steps out of order in run '{}': {} after {} "
                             "(line {})",
                             run, e.step, prev.step, tr.events.back().line));
      }
      tr.events.push_back(te);
    }
  }

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
  {  // values.csv
    CsvFile f(t.values_path(), kValuesHeader);
    Reader<7> r(f.bytes);
    f.read_header_flags(r, io::ignore_missing_column, kValuesHeader, "run",
                        "step", "kind", "tensor", "index", "value", "rank");
    for (std::string_view c :
         {"run", "step", "kind", "tensor", "index", "value"})
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
    std::map<std::tuple<int64_t, ValueKind, std::string, int64_t>, int64_t>
        seen;
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
      const auto [it, fresh] = seen.emplace(
          std::make_tuple(v.rank, v.kind, v.tensor, v.index), line);
      if (!fresh)
        f.fail(line, "",
               fmt::format("duplicated row: run '{}' step {} {} {}[{}] rank "
                           "{} was given at line {}",
                           run, v.step, kind, tensor, v.index, v.rank,
                           it->second));
      tr.values.push_back(std::move(v));
    }
  }
  return t;
}

std::vector<int64_t> value_ranks(const TraceRun& run) {
  std::set<int64_t> ranks{0};
  for (const TraceValue& v : run.values) ranks.insert(v.rank);
  for (const TraceBlock& b : run.blocks) ranks.insert(b.rank);
  return {ranks.begin(), ranks.end()};
}

ValueWhere locate_value(const Trace& t, const TraceRun& run, int64_t step,
                        ValueKind kind, int64_t flat, const ParamLayout& layout,
                        int64_t rank) {
  if (t.binary) {
    for (const TraceBlock& b : run.blocks)
      if (b.step == step && b.kind == kind && b.rank == rank)
        return {
            trace_detail::byte_at(t.binary->path, t.binary->offset(b, flat)),
            0};
    return {t.binary->path, 0};
  }
  const TensorView& tv = layout.tensor_of(flat);
  for (const TraceValue& v : run.values)
    if (v.step == step && v.kind == kind && v.rank == rank &&
        v.tensor == tv.name && v.index == flat - tv.offset)
      return {t.values_path(), v.line};
  return {t.values_path(), 0};
}

std::vector<TraceStep> gather_steps(const Trace& t, const TraceRun& run,
                                    const ParamLayout& layout, int64_t rank) {
  if (t.binary) return trace_detail::gather_blocks(t, run, layout, rank);
  const std::string file = t.values_path();
  std::map<std::string, const TensorView*, std::less<>> tensors;
  for (const TensorView& v : layout.tensors) tensors[v.name] = &v;

  struct Step {
    int64_t step = 0;
    std::vector<double> grad, param;
  };
  std::vector<Step> steps;
  std::vector<int64_t> count_grad, count_param;  // per step
  std::vector<int64_t> last_line;
  for (const TraceValue& v : run.values) {
    if (v.rank != rank) continue;
    const auto it = tensors.find(v.tensor);
    if (it == tensors.end()) {
      std::string known;
      for (const TensorView& tv : layout.tensors) {
        if (!known.empty()) known += ", ";
        known += tv.name;
      }
      throw InputError(file, v.line, 0, "tensor",
                       fmt::format("unknown tensor '{}' for this scenario's "
                                   "model; expected one of {}",
                                   v.tensor, known));
    }
    const TensorView& tv = *it->second;
    if (v.index >= tv.size())
      throw InputError(
          file, v.line, 0, "index",
          fmt::format("index {} out of range for {} [{} x {}] "
                      "({} elements)",
                      v.index, tv.name, tv.rows, tv.cols, tv.size()));
    if (steps.empty() || steps.back().step != v.step) {
      steps.push_back(Step{v.step, {}, {}});
      count_grad.push_back(0);
      count_param.push_back(0);
      last_line.push_back(v.line);
    }
    Step& s = steps.back();
    std::vector<double>& dst = v.kind == ValueKind::grad ? s.grad : s.param;
    if (dst.empty())
      dst.assign(size_t(layout.total),
                 std::numeric_limits<double>::quiet_NaN());
    dst[size_t(tv.offset + v.index)] = v.value;
    ++(v.kind == ValueKind::grad ? count_grad : count_param).back();
    last_line.back() = v.line;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const auto& [count, kind] :
         {std::pair{count_grad[i], "grad"}, std::pair{count_param[i], "param"}})
      if (count != 0 && count != layout.total)
        throw InputError(
            file, last_line[i], 0, kind,
            fmt::format("run '{}' step {}: {} of {} {} values "
                        "given; expected all or none",
                        run.name, steps[i].step, count, layout.total, kind));
  }
  std::vector<TraceStep> out;
  out.reserve(steps.size());
  for (Step& st : steps)
    out.push_back({st.step, std::move(st.grad), std::move(st.param)});
  return out;
}

// ---- the state section (the contract section: verify/trace/read_contract.cpp)

StateSection read_state(const std::string& dir, std::string_view run) {
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
