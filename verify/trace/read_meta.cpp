// Trace reading: meta.csv (verify/trace/read_csv.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "verify/trace/columns.hpp"
#include "verify/trace/read_csv.hpp"

namespace accumcheck::trace_detail {

void read_meta(Trace& t) {
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

namespace {

// A marker's key,value rows (every key the reader needs checked).
std::map<std::string, std::string> read_marker(const std::string& path) {
  CsvFile f(path, kMetaHeader);
  Reader<2> r(f.bytes);
  f.read_header(r, kMetaHeader, "key", "value");
  std::map<std::string, std::string> kv;
  std::string key, value;
  int64_t line = 0;
  while (f.row(r, line, key, value)) kv[key] = value;
  for (const char* k : {"rank", "ranks", "state", "steps", "backward"})
    if (!kv.count(k))
      f.fail(0, k, fmt::format("rank marker without the key '{}'", k));
  return kv;
}

}  // namespace

// The message for the marker of a one-process recording (ranks 1): how
// far the run got and how it ended; "" for a rank of several.
std::string single_marker(const std::string& path) {
  std::map<std::string, std::string> kv = read_marker(path);
  if (kv["ranks"] != "1") return "";
  const bool killed = kv["state"] == "recording";
  const std::string planned = kv.count("planned") && !kv["planned"].empty()
                                  ? " of " + kv["planned"]
                                  : "";
  return fmt::format(
      "the run stopped after {}{}{} optimizer step{} ({} backward pass{}): "
      "{}; the recorder wrote no trace of a finished run, so no verdict can "
      "be backed. Run the trainer to its end: the recorder's close() (or "
      "the end of its `with` block) writes the trace and removes this "
      "marker",
      killed ? "at least " : "", kv["steps"], planned,
      kv["steps"] == "1" && planned.empty() ? "" : "s", kv["backward"],
      kv["backward"] == "1" ? "" : "es",
      killed ? "the process died while recording (killed: SIGKILL, "
               "os._exit, a crash; the recorder had no chance to say)"
             : (kv["why"].empty() ? std::string("it ended without close()")
                                  : kv["why"]));
}

void refuse_incomplete_ranks(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr std::string_view kPrefix = "rank", kSuffix = ".incomplete";
  std::error_code ec;
  std::vector<std::string> markers;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > kPrefix.size() + kSuffix.size() &&
        name.starts_with(kPrefix) && name.ends_with(kSuffix))
      markers.push_back(it->path().string());
  }
  if (markers.empty()) return;
  std::sort(markers.begin(), markers.end());
  // The ranks still recording (died: killed, or ended past the recorder)
  // first, then those that ended without their part in a trace.
  std::vector<std::string> dead, ended;
  std::string named = markers.front();  // the file the error names
  if (markers.size() == 1) {
    // A one-process recorder's (ranks 1), or one rank's of several.
    const std::string one = single_marker(markers.front());
    if (!one.empty()) throw InputError(markers.front(), 0, 0, "", one);
  }
  for (const std::string& path : markers) {
    std::map<std::string, std::string> kv = read_marker(path);
    const std::string got = fmt::format(
        "rank {} of {} ({}): {} optimizer step{} and {} backward pass{} "
        "recorded",
        kv["rank"], kv["ranks"], path, kv["steps"],
        kv["steps"] == "1" ? "" : "s", kv["backward"],
        kv["backward"] == "1" ? "" : "es");
    if (kv["state"] == "recording" && dead.empty()) named = path;
    if (kv["state"] == "recording")
      dead.push_back(got +
                     ", then it stopped while recording (the process died: "
                     "killed (SIGKILL), os._exit, a crash)");
    else
      ended.push_back(got + ", then it ended without its part in a trace" +
                      (kv["why"].empty() ? "" : " (" + kv["why"] + ")"));
  }
  std::string msg =
      "the recording of a multi-rank run did not finish: no trace of every "
      "rank was written, so no verdict can be backed; ";
  bool first = true;
  for (const auto* list : {&dead, &ended})
    for (const std::string& s : *list) {
      msg += (first ? "" : "; ") + s;
      first = false;
    }
  msg +=
      ". Rerun the trainer until every rank reaches the recorder's close() "
      "(then the trace is written and these markers removed)";
  throw InputError(named, 0, 0, "", msg);
}

}  // namespace accumcheck::trace_detail
