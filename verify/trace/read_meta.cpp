// Trace reading: meta.csv (verify/trace/read_csv.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>

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

}  // namespace accumcheck::trace_detail
