// The trace's completion record (verify/trace/trace.hpp, complete.csv):
// written last by every writer (write_trace here, the PyTorch recorders'
// python/accumcheck_trace/trace.py), checked first by read_trace, so a
// trace whose run did not finish, or a file of it cut, emptied or
// replaced after the run, is refused (InputError, exit 2) naming the file
// and what happened, never judged.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"
#include "verify/trace/read_csv.hpp"
#include "verify/trace/sha256.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

namespace {

namespace fs = std::filesystem;

bool is_csv(std::string_view name) { return name.ends_with(".csv"); }

// A CSV file's rows: its lines after the header.
int64_t csv_rows(std::string_view bytes) {
  const auto lines = int64_t(std::count(bytes.begin(), bytes.end(), '\n'));
  return lines > 0 ? lines - 1 : 0;
}

std::string plural(int64_t n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

}  // namespace

std::string complete_csv(
    const std::vector<std::pair<std::string, std::string_view>>& files) {
  std::string o = std::string(kCompleteHeader) + "\n";
  for (const auto& [name, bytes] : files)
    o += fmt::format("{},{},{},{}\n", name,
                     is_csv(name) ? std::to_string(csv_rows(bytes)) : "",
                     bytes.size(), sha256_hex(bytes));
  o += fmt::format("{},{},,\n", kCompleteFile, files.size());
  return o;
}

void seal_trace(const std::string& dir) {
  std::vector<std::string> held;
  std::vector<std::pair<std::string, std::string_view>> files;
  for (std::string_view name : kTraceFiles) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) continue;
    held.push_back(read_file_bytes(
        p.string(), name == "values.bin" ? "trace_bin_bytes" : "trace_bytes"));
  }
  size_t i = 0;
  for (std::string_view name : kTraceFiles) {
    std::error_code ec;
    if (fs::is_regular_file(fs::path(dir) / name, ec))
      files.emplace_back(std::string(name), held[i++]);
  }
  write_file_atomically((fs::path(dir) / kCompleteFile).string(),
                        complete_csv(files));
}

void check_complete(const std::string& dir) {
  using trace_detail::CsvFile;
  using trace_detail::Reader;
  const fs::path d(dir);
  const std::string path = (d / kCompleteFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    // No trace at all (a wrong folder): the reader of meta.csv says so.
    if (!fs::exists(d / "meta.csv", ec)) return;
    throw InputError(
        path, 0, 0, "",
        "missing: the trace has no completion record, the file its writer "
        "writes last (the recorder's close(), or accumcheck run), so a run "
        "that did not finish, or a file cut short, cannot be told from a "
        "finished run's trace and no verdict can be backed; record the run "
        "again with this version (a writer of your own: "
        "docs/trace-format.md, complete.csv)");
  }
  CsvFile f(path, kCompleteHeader);
  Reader<4> r(f.bytes);
  f.read_header(r, kCompleteHeader, "file", "rows", "bytes", "sha256");
  struct Entry {
    std::string file, rows, bytes, sha;
    int64_t line = 0;
  };
  std::vector<Entry> rows;
  Entry e;
  while (f.row(r, e.line, e.file, e.rows, e.bytes, e.sha)) rows.push_back(e);
  if (rows.empty() || rows.back().file != kCompleteFile)
    f.fail(rows.empty() ? 1 : rows.back().line, "file",
           fmt::format("its last row ({},N,,) is missing: complete.csv was "
                       "cut; the trace cannot be trusted",
                       kCompleteFile));
  const Entry last = rows.back();
  rows.pop_back();
  if (f.integer(last.line, "rows", last.rows, 0) != int64_t(rows.size()))
    f.fail(last.line, "rows",
           fmt::format("{} files listed, {} rows precede this one: "
                       "complete.csv was cut or edited",
                       last.rows, rows.size()));
  std::map<std::string, int64_t, std::less<>> listed;
  for (const Entry& x : rows) {
    if (std::find(std::begin(kTraceFiles), std::end(kTraceFiles), x.file) ==
        std::end(kTraceFiles))
      f.fail(x.line, "file",
             fmt::format("'{}' is not a trace file; expected one of "
                         "meta.csv, events.csv, values.csv, values.bin, "
                         "state.csv, contract.csv, schedule.csv",
                         x.file));
    if (!listed.emplace(x.file, x.line).second)
      f.fail(x.line, "file", fmt::format("{} is listed twice", x.file));
  }
  // A trace file the record does not list: another run's.
  for (std::string_view name : kTraceFiles)
    if (!listed.count(name) && fs::exists(d / name, ec))
      throw InputError(
          (d / name).string(), 0, 0, "",
          fmt::format("a trace file that {} does not list: the run that "
                      "wrote this trace did not write it (left from another "
                      "run, or copied in); remove it, or record the run "
                      "again",
                      kCompleteFile));
  for (const Entry& x : rows) {
    const std::string file = (d / x.file).string();
    const bool csv = is_csv(x.file);
    const int64_t rows_rec =
        csv ? f.integer(x.line, "rows", x.rows, 0) : int64_t(-1);
    const int64_t bytes_rec = f.integer(x.line, "bytes", x.bytes, 0);
    if (x.sha.size() != 64 ||
        x.sha.find_first_not_of("0123456789abcdef") != std::string::npos)
      f.fail(x.line, "sha256",
             fmt::format("expected 64 lowercase hex digits, got '{}'", x.sha));
    const std::string recorded =
        csv ? fmt::format("{} ({} bytes)", plural(rows_rec, "row"), bytes_rec)
            : fmt::format("{} bytes", bytes_rec);
    if (!fs::exists(file, ec))
      throw InputError(file, 0, 0, "",
                       fmt::format("missing, but {} records {}: the file "
                                   "was removed after the run",
                                   kCompleteFile, recorded));
    const FileBytes held(file, csv ? "trace_bytes" : "trace_bin_bytes");
    const std::string_view bytes = held.view();
    const auto size = int64_t(bytes.size());
    if (size == 0 && bytes_rec > 0)
      throw InputError(file, 0, 0, "",
                       fmt::format("empty, but {} records {}: the file was "
                                   "emptied after the run",
                                   kCompleteFile, recorded));
    if (csv) {
      const int64_t got = csv_rows(bytes);
      const bool line_end = size == 0 || bytes.back() == '\n';
      if (got < rows_rec || (got == rows_rec && size < bytes_rec))
        throw InputError(
            file, 0, 0, "",
            fmt::format(
                "{} recorded in {}, {} read{}: the file was cut{}",
                plural(rows_rec, "row"), kCompleteFile, got,
                line_end ? "" : " and its last line has no line end",
                got == 0 && line_end ? " (emptied to its header)" : ""));
      if (got > rows_rec)
        throw InputError(
            file, 0, 0, "",
            fmt::format("{} recorded in {}, {} read: rows were "
                        "added after the run",
                        plural(rows_rec, "row"), kCompleteFile, got));
    }
    if (size < bytes_rec)
      throw InputError(file, 0, 0, "",
                       fmt::format("{} bytes recorded in {}, {} read: the "
                                   "file was cut",
                                   bytes_rec, kCompleteFile, size));
    if (size != bytes_rec)
      throw InputError(file, 0, 0, "",
                       fmt::format("{} bytes recorded in {}, {} read: the "
                                   "file was changed after the run",
                                   bytes_rec, kCompleteFile, size));
    if (sha256_hex(bytes) != x.sha)
      throw InputError(
          file, 0, 0, "",
          fmt::format("{} read, as recorded in {}, but its SHA-256 is not "
                      "the one recorded: the file was changed or replaced "
                      "after the run (another run's?)",
                      recorded, kCompleteFile));
  }
}

}  // namespace accumcheck
