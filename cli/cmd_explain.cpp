// `accumcheck explain`: a pitfall or lesson, for people learning it
// (verify/teach/explain.hpp).
#include <cstdio>
#include <string>

#include "cli/commands.hpp"
#include "sim/errors.hpp"
#include "verify/teach/explain.hpp"

namespace accumcheck::cli {

int explain_command(const ExplainOptions& o) {
  if (o.list || o.id.empty()) {
    for (const ExplainEntry& e : explain_entries())
      std::printf("%-32s %.*s\n", std::string(e.id).c_str(),
                  int(e.title.size()), e.title.data());
    return 0;
  }
  const ExplainEntry* e = find_explain(o.id);
  if (!e) {
    std::string known;
    for (const ExplainEntry& x : explain_entries())
      known.append(known.empty() ? "" : ", ").append(x.id);
    throw InputError(
        "", 0, 0, "explain",
        "unknown pitfall or lesson '" + o.id + "'; known: " + known);
  }
  std::printf("%s", explain_text(*e).c_str());
  return 0;
}

}  // namespace accumcheck::cli
