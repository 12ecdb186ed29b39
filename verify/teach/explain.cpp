// `accumcheck explain`: finding an entry (by id, scenario, lesson subject
// or a combination of pitfalls) and writing it for the terminal.  The
// entries themselves are data, in parts (verify/teach/explain_catalog.hpp).
#include "verify/teach/explain.hpp"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "sim/pitfalls.hpp"
#include "verify/teach/explain_catalog.hpp"

namespace accumcheck {

std::span<const ExplainEntry> explain_entries() {
  static const std::vector<ExplainEntry> all = [] {
    std::vector<ExplainEntry> v;
    for (const std::span<const ExplainEntry> part :
         {explain_catalog::loop_pitfalls(), explain_catalog::loop_lessons(),
          explain_catalog::rank_and_state_pitfalls(),
          explain_catalog::framework_pitfalls(),
          explain_catalog::system_lessons()})
      v.insert(v.end(), part.begin(), part.end());
    return v;
  }();
  return all;
}

const ExplainEntry* find_explain(std::string_view id) {
  for (const ExplainEntry& e : explain_entries())
    if (e.id == id) return &e;
  for (const ExplainEntry& e : explain_entries()) {
    std::string_view s = e.scenarios;
    while (!s.empty()) {
      const size_t sp = s.find(' ');
      if (s.substr(0, sp) == id) return &e;
      if (sp == std::string_view::npos) break;
      s.remove_prefix(sp + 1);
    }
  }
  // A lesson by its subject alone: `explain fsdp` is fsdp-lesson.
  const std::string lesson = std::string(id) + "-lesson";
  for (const ExplainEntry& e : explain_entries())
    if (e.id == lesson) return &e;
  return nullptr;
}

std::string explain_text(const ExplainEntry& e) {
  std::string o;
  o.append(e.id).append(": ").append(e.title).append("\n\n");
  o.append(e.story).append("\n\nThe loop, wrong (-) and right (+):\n\n");
  std::string_view d = e.diff;
  while (!d.empty()) {
    const size_t nl = d.find('\n');
    o.append("    ").append(d.substr(0, nl)).append("\n");
    if (nl == std::string_view::npos) break;
    d.remove_prefix(nl + 1);
  }
  o.append("\nWhat the oracle predicts: ").append(e.formula).append("\n");
  if (const auto p = pitfall_from_id(e.id); p && pitfall_performance_only(*p))
    o.append(
        "Performance only: the values are those of the loop without it; "
        "certify PASSes such a trace (both tiers) with a performance "
        "finding naming it and what it costs\n");
  o.append("Run: ");
  std::string_view s = e.scenarios;
  bool first = true;
  while (!s.empty()) {
    const size_t sp = s.find(' ');
    o.append(first ? "" : ", ")
        .append("accumcheck run scenarios/")
        .append(s.substr(0, sp))
        .append(".toml");
    first = false;
    if (sp == std::string_view::npos) break;
    s.remove_prefix(sp + 1);
  }
  o.append("\nField reports: ").append(e.field).append("\n");
  o.append("Guarded by: ").append(e.properties).append("\n");
  return o;
}

std::vector<const ExplainEntry*> find_explain_parts(std::string_view id,
                                                    std::string& unknown) {
  const auto trim = [](std::string_view v) {
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    return v;
  };
  std::vector<const ExplainEntry*> out;
  if (const ExplainEntry* e = find_explain(trim(id))) return {e};
  if (id.find('+') == std::string_view::npos) {
    unknown = std::string(trim(id));
    return {};
  }
  while (true) {
    const size_t plus = id.find('+');
    const std::string_view part = trim(id.substr(0, plus));
    const ExplainEntry* e = part.empty() ? nullptr : find_explain(part);
    if (!e) {
      unknown = std::string(part);
      return {};
    }
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    if (plus == std::string_view::npos) break;
    id.remove_prefix(plus + 1);
  }
  return out;
}

std::string explain_parts_text(const std::vector<const ExplainEntry*>& parts) {
  if (parts.size() == 1) return explain_text(*parts.front());
  std::string o;
  std::string names;
  for (const ExplainEntry* e : parts)
    names.append(names.empty() ? "" : "+").append(e->id);
  o.append(names).append(": ").append(std::to_string(parts.size()));
  o.append(
      " pitfalls at once. certify ranks each combination as one candidate: "
      "the one trainer loop with every one of these mistakes, so a trace that "
      "matches it makes them all; fix each (below, in order).\n");
  for (size_t i = 0; i < parts.size(); ++i)
    o.append("\n[" + std::to_string(i + 1) + " of " +
             std::to_string(parts.size()) + "] ")
        .append(explain_text(*parts[i]));
  return o;
}

}  // namespace accumcheck
