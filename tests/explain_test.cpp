// `accumcheck explain` covers every pitfall and every scenario, and its
// entries name only scenarios and properties that exist.  A pitfall added
// to sim/pitfalls.hpp, or a scenario added to scenarios/, fails here until
// verify/teach/explain.cpp has its entry.
#include "verify/teach/explain.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "properties/harness.hpp"
#include "sim/pitfalls.hpp"
#include "tests/source_dir.hpp"

namespace accumcheck {
namespace {

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t sp = std::min(s.find(' ', at), s.size());
    if (sp > at) out.emplace_back(s.substr(at, sp - at));
    at = sp + 1;
  }
  return out;
}

std::set<std::string> scenario_names() {
  std::set<std::string> names;
  for (const auto& f : std::filesystem::directory_iterator(
           ::accumcheck::testing_util::source_dir() + "/scenarios"))
    if (f.path().extension() == ".toml") names.insert(f.path().stem());
  return names;
}

TEST(Explain, EveryPitfallHasAnEntry) {
  for (Pitfall p : kAllPitfalls) {
    const ExplainEntry* e = find_explain(pitfall_id(p));
    ASSERT_NE(e, nullptr) << "no explain entry for pitfall " << pitfall_id(p)
                          << ": add one to verify/teach/explain.cpp";
    EXPECT_EQ(e->id, pitfall_id(p));
  }
}

TEST(Explain, EveryScenarioIsCovered) {
  const std::set<std::string> names = scenario_names();
  ASSERT_GT(names.size(), 20u);
  for (const std::string& n : names)
    EXPECT_NE(find_explain(n), nullptr)
        << "scenario " << n << " is in no explain entry's scenarios list";
}

TEST(Explain, EntriesNameExistingScenariosAndProperties) {
  const std::set<std::string> names = scenario_names();
  std::set<std::string> props;
  for (const auto& p : properties::all_properties()) props.insert(p.name);
  ASSERT_GT(props.size(), 20u);
  std::set<std::string> ids;
  for (const ExplainEntry& e : explain_entries()) {
    EXPECT_TRUE(ids.insert(std::string(e.id)).second) << "duplicate " << e.id;
    for (const std::string& s : words(e.scenarios))
      EXPECT_TRUE(names.count(s)) << e.id << ": no scenarios/" << s << ".toml";
    ASSERT_FALSE(words(e.properties).empty()) << e.id;
    for (const std::string& p : words(e.properties))
      EXPECT_TRUE(props.count(p)) << e.id << ": no property " << p;
    for (std::string_view field :
         {e.title, e.story, e.diff, e.formula, e.field})
      EXPECT_FALSE(field.empty()) << e.id;
    // A diff shows both loops.
    EXPECT_TRUE(e.diff.starts_with("-") ||
                e.diff.find("\n-") != std::string_view::npos)
        << e.id << ": the diff has no wrong line";
    EXPECT_NE(e.diff.find('+'), std::string_view::npos)
        << e.id << ": the diff has no right line";
  }
}

TEST(Explain, TextHasEverySection) {
  const std::string t =
      explain_text(*find_explain("seed-002-loop-never-steps"));
  for (const char* s : {"seed-002-loop: ", "What the oracle predicts:",
                        "Run: accumcheck run scenarios/seed-002-loop.toml",
                        "Field reports:", "Guarded by:", "    -"})
    EXPECT_NE(t.find(s), std::string::npos) << s << "\n" << t;
  EXPECT_EQ(find_explain("no-such-pitfall"), nullptr);
  ASSERT_NE(find_explain("fsdp"), nullptr);  // a lesson by its subject
  EXPECT_EQ(find_explain("fsdp")->id, "fsdp-lesson");
  EXPECT_EQ(find_explain("no-such"), nullptr);
}

}  // namespace
}  // namespace accumcheck
