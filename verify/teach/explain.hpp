// `accumcheck explain`: the teaching entry of every pitfall and lesson.
//
// One entry per pitfall id of sim/pitfalls.hpp (kAllPitfalls) and per
// lesson: the story, the wrong and the right loop as a short PyTorch diff,
// the formula the oracle predicts, the scenarios to run, the field reports
// it comes from (FIELD.md issue numbers, seed documents) and the
// properties (properties/) that guard it.  The entries are data (tables in
// parts: verify/teach/explain_catalog.hpp); tests/explain_test.cpp checks that
// every pitfall and every scenario in scenarios/ is covered.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace accumcheck {

struct ExplainEntry {
  std::string_view id;     // pitfall id or lesson name
  std::string_view title;  // one line
  std::string_view story;  // a paragraph
  std::string_view diff;   // unified-diff lines: "-wrong" / "+right" / " same"
  std::string_view formula;     // what the oracle predicts
  std::string_view scenarios;   // space-separated scenario names (scenarios/)
  std::string_view field;       // field reports and seeds
  std::string_view properties;  // space-separated property names
};

std::span<const ExplainEntry> explain_entries();
// The entry with this id, or the entry whose scenarios list `id`; nullptr
// when none.
const ExplainEntry* find_explain(std::string_view id);
// The entry as text, for the terminal.
std::string explain_text(const ExplainEntry& e);

// Every id certify prints: one entry's id (or a scenario or lesson
// name, as find_explain), or a combination of pitfalls joined by '+'
// ("token-mean-of-means+partial-cycle-scale-by-k", a candidate certify
// ranks), each part an entry.  The entries in order; empty when a part
// names none, with that part in `unknown`.
std::vector<const ExplainEntry*> find_explain_parts(std::string_view id,
                                                    std::string& unknown);
// The text of what find_explain_parts found: one entry's explain_text, or a
// combination's line saying what it is, then each part's.
std::string explain_parts_text(const std::vector<const ExplainEntry*>& parts);

}  // namespace accumcheck
