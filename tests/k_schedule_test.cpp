// K that changes during training: the scenario syntax (a list per epoch,
// a ramp rule), K = 0 refused with seed 002's formula named, the plan's
// windows per epoch, and the horizon a trainer derives (total = "auto").
#include "sim/k_schedule.hpp"

#include <gtest/gtest.h>

#include <string>

#include "sim/errors.hpp"
#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "tests/scenario_test_util.hpp"

namespace accumcheck {
namespace {

using testing_util::expect_scenario_error;

// Line numbers below refer to this text.
const std::string kRamp = R"(story = "ramp"
[model]
widths = [3, 4, 2]
[data]
samples = 24
[batching]
micro_batch = 2
accumulation = [2, 4, 6]
epochs = 3
[optimizer]
lr = 0.1
[schedule]
kind = "linear"
warmup_ratio = 0.25
total = "auto"
)";

using testing_util::with;

TEST(KSchedule, ListPerEpoch) {
  const Scenario s = parse_scenario_string(kRamp, "s.toml");
  EXPECT_EQ(s.batching.accumulation, 2);
  EXPECT_TRUE(k_changes(s.batching));
  for (int64_t e = 0; e < 3; ++e)
    EXPECT_EQ(accumulation_at(s.batching, e), 2 * (e + 1));
  // 12 micro-steps per epoch: windows of 2, 4 and 6 micro-batches.
  const Plan p = materialize(make_plan(s));
  ASSERT_EQ(p.epochs.size(), 3u);
  const size_t windows[] = {6, 3, 2};
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(p.epochs[e].accumulation, int64_t(2 * (e + 1)));
    ASSERT_EQ(p.epochs[e].windows.size(), windows[e]);
    for (const Window& w : p.epochs[e].windows) {
      EXPECT_EQ(int64_t(w.micro.size()), p.epochs[e].accumulation);
      EXPECT_FALSE(w.partial);
    }
  }
  EXPECT_NE(describe(s).find("K=2,4,6"), std::string::npos) << describe(s);
}

TEST(KSchedule, RampRuleIsSeed002sFormulaFromEpochOne) {
  // min(epoch * 2, 8) over the seed's epochs 1..5.
  const Scenario s = parse_scenario_string(
      with(with(kRamp, "accumulation = [2, 4, 6]",
                "accumulation = { start = 2, step = 2, max = 8 }"),
           "epochs = 3", "epochs = 5"),
      "s.toml");
  const int64_t want[] = {2, 4, 6, 8, 8};
  for (int64_t e = 0; e < 5; ++e)
    EXPECT_EQ(accumulation_at(s.batching, e), want[e]) << e;
}

TEST(KSchedule, KZeroIsRefusedNamingSeed002) {
  // Seed 002's own epoch 0: K = min(0 * 2, 8) = 0.
  expect_scenario_error(
      with(kRamp, "[2, 4, 6]", "[0, 2, 4]"), 8, "batching.accumulation[0]",
      "seed 002's cold start `accumulation_steps = min(epoch * 2, "
      "8)` gives K = 0 in epoch 0");
  expect_scenario_error(with(kRamp, "accumulation = [2, 4, 6]",
                             "accumulation = { start = 0, step = 2, max = 8 }"),
                        8, "batching.accumulation.start", "min(epoch * 2, 8)");
  expect_scenario_error(
      with(kRamp, "accumulation = [2, 4, 6]", "accumulation = 0"), 8,
      "batching.accumulation", "min(epoch * 2, 8)");
  // Other bad values say what was expected, without the hint.
  expect_scenario_error(with(kRamp, "[2, 4, 6]", "[2, -1, 4]"), 8,
                        "batching.accumulation[1]",
                        "expected an integer >= 1, got -1");
  expect_scenario_error(with(kRamp, "[2, 4, 6]", "[2, 4]"), 8,
                        "batching.accumulation", "one K per epoch (3 entries");
  expect_scenario_error(with(kRamp, "accumulation = [2, 4, 6]",
                             "accumulation = { start = 2, stp = 2, max = 8 }"),
                        8, "batching.accumulation.stp",
                        "known keys: start, step, max");
  expect_scenario_error(with(kRamp, "[2, 4, 6]", "\"ramp\""), 8,
                        "batching.accumulation", "an array of one K per epoch");
  // The lr-scaling lesson scales by one K.
  expect_scenario_error(kRamp + "[trainer]\nlr_scaling = \"linear\"\n", 17,
                        "trainer.lr_scaling", "changes from epoch to epoch");
}

TEST(KSchedule, AutoHorizon) {
  const Scenario s = parse_scenario_string(kRamp, "s.toml");
  EXPECT_TRUE(s.schedule.total_auto);
  // Correct: 6 + 3 + 2 = 11 steps, warmup ceil(11 / 4) = 3; with the
  // initial K only: 3 * 6 = 18, warmup ceil(18 / 4) = 5.
  EXPECT_EQ(planned_optimizer_steps(s), make_plan(s).windows());
  EXPECT_EQ(planned_optimizer_steps(s), materialize(make_plan(s)).windows());
  EXPECT_EQ(resolved_schedule(s).total, 11);
  EXPECT_EQ(resolved_schedule(s).warmup, 3);
  EXPECT_EQ(resolved_schedule(s, true).total, 18);
  EXPECT_EQ(resolved_schedule(s, true).warmup, 5);
  expect_scenario_error(with(kRamp, "total = \"auto\"", "total = \"all\""), 15,
                        "schedule.total", "an integer >= 1 or \"auto\"");
  expect_scenario_error(with(kRamp, "total = \"auto\"", "total = 10"), 14,
                        "schedule.warmup_ratio", "total = \"auto\" only");
}

TEST(KSchedule, RoundTrip) {
  const Scenario a = parse_scenario_string(kRamp, "s.toml");
  const Scenario b = parse_scenario_string(to_toml(a), "s.toml");
  EXPECT_EQ(to_toml(a), to_toml(b));
  EXPECT_EQ(a.batching.accumulation_per_epoch,
            b.batching.accumulation_per_epoch);
  EXPECT_EQ(b.schedule.total_auto, true);
  EXPECT_EQ(b.schedule.warmup_ratio, 0.25);
}

}  // namespace
}  // namespace accumcheck
