// Scenario keys of the norm / token / dropout models: precise errors and
// the to_toml round trip; the dataset's token lengths and replication.
#include <gtest/gtest.h>

#include <string>

#include "sim/data.hpp"
#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"
#include "tests/scenario_test_util.hpp"

namespace accumcheck {
namespace {

using testing_util::expect_scenario_error;

const std::string kBn = R"(story = "bn"
[model]
widths = [3, 4, 2]
norm = "batchnorm"
[data]
samples = 9
[batching]
micro_batch = 4
accumulation = 2
[optimizer]
lr = 0.1
)";

const std::string kToken = R"(story = "tok"
[model]
kind = "token"
vocab = 5
embed = 3
[data]
samples = 12
seed = 4
lengths = "long-tailed"
min_len = 2
max_len = 9
[batching]
micro_batch = 2
accumulation = 3
[optimizer]
lr = 0.1
[trainer]
pitfalls = ["token-mean-of-means"]
)";

TEST(NormScenario, BatchNormRefusesAMicroBatchOfOne) {
  // 9 samples in micro-batches of 4 leave one of 1.
  expect_scenario_error(kBn, 8, "batching.micro_batch",
                        "leaves a micro-batch of 1");
  std::string ok = kBn;
  ok.replace(ok.find("samples = 9"), 11, "samples = 10");
  EXPECT_EQ(parse_scenario_string(ok, "s.toml").model.norm,
            NormKind::batchnorm);
}

TEST(NormScenario, PreciseErrors) {
  std::string t = kBn;
  t.replace(t.find("\"batchnorm\""), 11, "\"batchnrom\"");
  expect_scenario_error(t, 4, "model.norm", "did you mean \"batchnorm\"");
  t = kToken;
  t.replace(t.find("\"token-mean-of-means\""), 21, "\"sample-mean-of-means\"");
  expect_scenario_error(t, 18, "trainer.pitfalls[0]", "token-mean-of-means");
  t = kToken;
  t.replace(t.find("min_len = 2"), 11, "min_len = 10");
  expect_scenario_error(t, 10, "data.min_len", "1..9");
  t = kBn;
  t.replace(t.find("samples = 9"), 11, "samples = 10\nlengths = \"fixed\"");
  expect_scenario_error(t, 7, "data.lengths", "kind = \"token\" only");
  t = kBn;
  t.replace(t.find("norm = \"batchnorm\""), 18, "dropout = 1.5");
  expect_scenario_error(t, 4, "model.dropout", "[0, 1)");
}

TEST(NormScenario, RoundTrip) {
  std::string bn = kBn;
  bn.replace(bn.find("samples = 9"), 11,
             "samples = 8\nshuffle = false\nreplicate = true");
  bn.replace(bn.find("norm = \"batchnorm\""), 18,
             "norm = \"batchnorm\"\ndropout = 0.25");
  for (const std::string& text : {bn, kToken}) {
    const Scenario a = parse_scenario_string(text, "s.toml");
    const Scenario b = parse_scenario_string(to_toml(a), "s.toml");
    EXPECT_EQ(to_toml(a), to_toml(b));
    EXPECT_EQ(a.model.kind, b.model.kind);
    EXPECT_EQ(a.model.norm, b.model.norm);
    EXPECT_EQ(a.model.dropout, b.model.dropout);
    EXPECT_EQ(a.model.widths, b.model.widths);
    EXPECT_EQ(a.data.lengths, b.data.lengths);
    EXPECT_EQ(a.data.min_len, b.data.min_len);
    EXPECT_EQ(a.data.max_len, b.data.max_len);
    EXPECT_EQ(a.data.replicate, b.data.replicate);
    EXPECT_EQ(a.trainer.pitfalls, b.trainer.pitfalls);
  }
}

TEST(NormScenario, GroupNormGroupsDivideEveryHiddenWidth) {
  std::string t = kBn;
  t.replace(t.find("samples = 9"), 11, "samples = 8");
  t.replace(t.find("norm = \"batchnorm\""), 18,
            "norm = \"groupnorm\"\nnorm_groups = 2");
  const Scenario s = parse_scenario_string(t, "s.toml");
  EXPECT_EQ(s.model.norm, NormKind::groupnorm);
  EXPECT_EQ(s.model.norm_groups, 2);
  const Scenario back = parse_scenario_string(to_toml(s), "s.toml");
  EXPECT_EQ(back.model.norm_groups, 2);
  EXPECT_EQ(to_toml(s), to_toml(back));
  // 4 features in 4 groups: groups of one feature.
  std::string bad = t;
  bad.replace(bad.find("norm_groups = 2"), 15, "norm_groups = 4");
  expect_scenario_error(bad, 3, "model.widths[1]", "multiple of 8");
  bad = t;
  bad.replace(bad.find("\nnorm_groups = 2"), 16, "");
  expect_scenario_error(bad, 2, "model.norm_groups", "missing required key");
  bad = kBn;
  bad.replace(bad.find("norm = \"batchnorm\""), 18,
              "norm = \"layernorm\"\nnorm_groups = 2");
  expect_scenario_error(bad, 5, "model.norm_groups", "groupnorm");
}

TEST(NormScenario, TokenDataIsKeyedBySampleAndPadded) {
  const Scenario s = parse_scenario_string(kToken, "s.toml");
  const Dataset d = make_dataset(s);
  ASSERT_EQ(d.max_len, 9);
  for (int64_t i = 0; i < d.n; ++i) {
    const int64_t len = d.length[size_t(i)];
    EXPECT_GE(len, 2);
    EXPECT_LE(len, 9);
    EXPECT_EQ(len, sequence_length(s.data, i));
    for (int64_t t = 0; t < d.max_len; ++t) {
      const int32_t tgt = d.token_targets[size_t(i * d.max_len + t)];
      if (t < len)
        EXPECT_TRUE(tgt >= 0 && tgt < 5);
      else
        EXPECT_EQ(tgt, Dataset::kIgnoreIndex);
    }
  }
  // A bigger dataset with the same seed has the same first sequences.
  Scenario s2 = s;
  s2.data.samples = 30;
  const Dataset d2 = make_dataset(s2);
  for (size_t k = 0; k < d.tokens.size(); ++k)
    EXPECT_EQ(d.tokens[k], d2.tokens[k]);
}

}  // namespace
}  // namespace accumcheck
