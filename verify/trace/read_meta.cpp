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
  for (const std::string& path : markers) {
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
                     "killed, or ended without the recorder's close())");
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
