// `accumcheck explain`'s catalog, in parts (verify/teach/explain.hpp's
// entries, kept as data): explain.cpp joins them, in this order, into
// explain_entries(), the order `accumcheck explain --list` prints and
// find_explain searches.  Field reports cite /work/shared/FIELD.md
// (repository #issue) and the seed documents (docs/seeds in the shared
// folder) by number; properties are the names `accumcheck check --list`
// prints.
//
// The right loop, shared by most diffs:
//   for i, (x, y) in enumerate(loader):
//       loss = criterion(model(x), y) / K
//       loss.backward()
//       if (i + 1) % K == 0:
//           optimizer.step(); scheduler.step(); optimizer.zero_grad()
#pragma once

#include <span>

#include "verify/teach/explain.hpp"

namespace accumcheck::explain_catalog {

std::span<const ExplainEntry> loop_pitfalls();            // explain_loop.cpp
std::span<const ExplainEntry> loop_lessons();             // explain_lessons.cpp
std::span<const ExplainEntry> rank_and_state_pitfalls();  // explain_ranks.cpp
std::span<const ExplainEntry> framework_pitfalls();  // explain_frameworks.cpp
std::span<const ExplainEntry> system_lessons();      // explain_lessons.cpp

}  // namespace accumcheck::explain_catalog
