// Internal to the trace readers (verify/trace/read_*.cpp): one CSV file
// of a trace held in memory with the checks every trace file shares
// (CsvFile), the run each row names (RunTracker), and the reader of each
// file, which read_trace (read.cpp) calls in order: meta.csv, events.csv,
// then values.csv or values.bin (values_bin.hpp).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include "sim/atomic_file.hpp"
#include "sim/csv_lines.hpp"
#include "sim/errors.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::trace_detail {

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

// meta.csv into t.meta: every required key, the schema first of all.
void read_meta(Trace& t);

// A recording leaves one marker per rank (a one-process recorder: rank 0
// of 1), DIR/rank<r>.incomplete (key,value: rank, ranks, state, steps,
// backward, why, and optionally planned; written by
// python/accumcheck_trace/trace.py write_rank_marker) from the recorder's
// start until the trace is written and sealed.  A folder holding any is
// the trace of a run that did not finish: InputError (exit 2) naming each
// such rank, its marker file, how far it got and how it ended.
void refuse_incomplete_ranks(const std::string& dir);
// The message refuse_incomplete_ranks gives for the marker of a
// one-process recording (ranks 1: the Recorder's, the ContractRecorder's;
// `planned`, when present, the steps the run was to take): "the run
// stopped after 5 of 8 optimizer steps (...): KeyboardInterrupt ...";
// "" for a rank of a multi-rank run.
std::string single_marker(const std::string& path);
// events.csv (version 1: no sample_ids column) into the runs' events.
void read_events(Trace& t, RunTracker& runs);
// values.csv into the runs' values.
void read_values_csv(Trace& t, RunTracker& runs);

}  // namespace accumcheck::trace_detail
