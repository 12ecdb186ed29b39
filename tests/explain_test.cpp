// `accumcheck explain` covers every pitfall and every scenario, and its
// entries name only scenarios and properties that exist.  A pitfall added
// to sim/pitfalls.hpp, or a scenario added to scenarios/, fails here until
// the catalog (verify/teach/explain_catalog.hpp) has its entry.
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
                          << ": add one to the catalog "
                          << "(verify/teach/explain_catalog.hpp)";
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

// Every candidate certify can name (each scope, both tiers: single
// pitfalls, pairs, the step budget's triples) is an id `explain` takes,
// each part explained in order (issue 44: pair ids were refused).  The
// check depends on the candidate alone, and the scopes name most of them
// many times over (137032 candidates, 18320 distinct, at this writing):
// each distinct one is checked once, the same set at a seventh of the work.
TEST(Explain, EveryCandidateCertifyNamesExplains) {
  std::set<std::vector<Pitfall>> candidates;
  for (int bits = 0; bits < 128; ++bits) {
    const CandidateScope scope{.token_loss = (bits & 1) != 0,
                               .loss_scaling = (bits & 2) != 0,
                               .ema = (bits & 4) != 0,
                               .contract_tier = (bits & 8) != 0,
                               .contract_lowp_buffer = (bits & 16) != 0,
                               .stopped_short = (bits & 32) != 0,
                               .contract_shard_clip = (bits & 64) != 0};
    for (std::vector<Pitfall>& sem : candidate_semantics(scope))
      candidates.insert(std::move(sem));
  }
  size_t combos = 0;
  for (const std::vector<Pitfall>& sem : candidates) {
    const std::string name = semantics_name(sem);
    std::string unknown;
    const auto parts = find_explain_parts(name, unknown);
    ASSERT_EQ(parts.size(), sem.empty() ? 1 : sem.size())
        << name << ": unknown part '" << unknown << "'";
    for (size_t i = 0; i < sem.size(); ++i)
      EXPECT_EQ(parts[i]->id, pitfall_id(sem[i])) << name;
    const std::string t = explain_parts_text(parts);
    if (sem.size() > 1) {
      ++combos;
      EXPECT_TRUE(t.starts_with(name + ": " + std::to_string(sem.size()) +
                                " pitfalls at once"))
          << t;
      for (size_t i = 0; i < sem.size(); ++i)
        EXPECT_NE(t.find("[" + std::to_string(i + 1) + " of " +
                         std::to_string(sem.size()) + "] " +
                         std::string(pitfall_id(sem[i])) + ": "),
                  std::string::npos)
            << name;
    } else {
      EXPECT_EQ(t, explain_text(*parts.front())) << name;
    }
  }
  EXPECT_GT(combos, 0u);
  std::string unknown;
  EXPECT_TRUE(find_explain_parts("token-mean-of-means+nope", unknown).empty());
  EXPECT_EQ(unknown, "nope");
  EXPECT_TRUE(find_explain_parts("token-mean-of-means+", unknown).empty());
  EXPECT_TRUE(find_explain_parts("nope", unknown).empty());
  EXPECT_EQ(unknown, "nope");
}

}  // namespace
}  // namespace accumcheck
