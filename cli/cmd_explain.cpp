// `accumcheck explain`: a pitfall or lesson, for people learning it
// (verify/teach/explain.hpp).
#include <cstdio>
#include <string>
#include <vector>

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
  // Every id certify prints: a pitfall, or a combination "a+b" of them.
  std::string unknown;
  const std::vector<const ExplainEntry*> parts =
      find_explain_parts(o.id, unknown);
  if (parts.empty()) {
    std::string known;
    for (const ExplainEntry& x : explain_entries())
      known.append(known.empty() ? "" : ", ").append(x.id);
    throw InputError(
        "", 0, 0, "explain",
        (unknown == o.id
             ? "unknown pitfall or lesson '" + o.id + "'"
             : "'" + o.id + "': unknown pitfall or lesson '" + unknown +
                   "' (a combination joins pitfall ids with '+')") +
            "; known: " + known);
  }
  std::printf("%s", explain_parts_text(parts).c_str());
  return 0;
}

}  // namespace accumcheck::cli
