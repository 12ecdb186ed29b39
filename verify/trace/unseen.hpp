// What a recorder reports it could not see (meta.csv's `unseen`), judged the
// same way by both tiers: a trace that would FAIL while its recorder says
// it missed something is not judged (exit 2, naming meta.csv's line), as a
// verdict on a loop certify was not shown could be false.  A PASS stands:
// whatever was missed did not move the values out of the bound.
#pragma once

#include <fmt/format.h>

#include <string>

#include "sim/errors.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

inline void refuse_unseen(const Trace& t, bool pass,
                          const std::string& verdict) {
  const std::string unseen = t.meta_value("unseen");
  if (pass || unseen.empty()) return;
  int64_t line = 0;
  for (size_t i = 0; i < t.meta.size(); ++i)
    if (t.meta[i].first == "unseen") line = int64_t(i) + 2;
  throw InputError(
      t.meta_path(), line, 0, "unseen",
      fmt::format("the trace would FAIL ({}), but its recorder reports what "
                  "it could not see: {}; certify does not judge a loop on "
                  "what it was not shown (record it, or remove the cause, "
                  "and certify again)",
                  verdict, unseen));
}

}  // namespace accumcheck
