// Schedule arithmetic: windows, partial windows, short micro-batches, the
// large-batch reference, rank sharding, and the lr schedules' formulas.
#include "sim/plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "sim/lr_schedule.hpp"

namespace accumcheck {
namespace {

Scenario scenario(int64_t n, int64_t b, int64_t K, int64_t epochs = 1,
                  int64_t R = 1) {
  Scenario s;
  s.data.samples = n;
  s.data.seed = 7;
  s.batching.micro_batch = b;
  s.batching.accumulation = K;
  s.batching.epochs = epochs;
  s.batching.ranks = R;
  return s;
}

TEST(Plan, ShortMicroBatchAndPartialWindow) {
  // n = 10, b = 3: micro-batches 3,3,3,1; K = 3: windows {3,3,3}, {1}.
  const Plan p = materialize(make_plan(scenario(10, 3, 3)));
  ASSERT_EQ(p.epochs.size(), 1u);
  const auto& w = p.epochs[0].windows;
  ASSERT_EQ(w.size(), 2u);
  EXPECT_FALSE(w[0].partial);
  EXPECT_TRUE(w[1].partial);
  EXPECT_EQ(w[0].items(), 9);
  EXPECT_EQ(w[1].items(), 1);
  EXPECT_EQ(w[1].micro.size(), 1u);
  EXPECT_EQ(p.epochs[0].micro_steps(), 4);
}

TEST(Plan, EveryEpochSeesEverySampleOnce) {
  const Plan p = materialize(make_plan(scenario(23, 4, 3, 3)));
  for (const EpochPlan& e : p.epochs) {
    std::multiset<int64_t> seen;
    for (const Window& w : e.windows)
      for (const MicroBatch& m : w.micro)
        for (const auto& sh : m.shards) seen.insert(sh.begin(), sh.end());
    ASSERT_EQ(seen.size(), 23u);
    for (int64_t i = 0; i < 23; ++i) EXPECT_EQ(seen.count(i), 1u);
  }
  // Seeded shuffles differ between epochs but not between calls.
  EXPECT_NE(epoch_order(scenario(23, 4, 3), 0),
            epoch_order(scenario(23, 4, 3), 1));
  EXPECT_EQ(epoch_order(scenario(23, 4, 3), 1),
            epoch_order(scenario(23, 4, 3), 1));
}

TEST(Plan, LargeBatchHoldsTheSameWindows) {
  const Plan p = materialize(make_plan(scenario(17, 2, 4, 2)));
  const Plan big = as_large_batch(p);
  EXPECT_EQ(big.accumulation, 1);
  ASSERT_EQ(big.windows(), p.windows());
  for (size_t e = 0; e < p.epochs.size(); ++e)
    for (size_t w = 0; w < p.epochs[e].windows.size(); ++w) {
      const Window& a = p.epochs[e].windows[w];
      const Window& b = big.epochs[e].windows[w];
      ASSERT_EQ(b.micro.size(), 1u);
      EXPECT_FALSE(b.partial);
      EXPECT_EQ(a.items(), b.items());
    }
}

TEST(Plan, RanksShardLikeDistributedSampler) {
  // n = 7, R = 2: padded to 8 by wrapping; each rank holds 4 ids.
  const Plan p = materialize(make_plan(scenario(7, 2, 2, 1, 2)));
  const auto& m0 = p.epochs[0].windows[0].micro[0];
  ASSERT_EQ(m0.shards.size(), 2u);
  EXPECT_EQ(p.epochs[0].micro_steps(), 2);
  EXPECT_EQ(p.epochs[0].windows[0].items(), 8);
}

TEST(Schedule, LinearWarmupDecayAndPastHorizon) {
  ScheduleSpec s;
  s.kind = ScheduleKind::linear;
  s.warmup = 2;
  s.total = 6;
  EXPECT_EQ(lr_multiplier(s, 0), 0.0);
  EXPECT_EQ(lr_multiplier(s, 1), 0.5);
  EXPECT_EQ(lr_multiplier(s, 2), 1.0);
  EXPECT_EQ(lr_multiplier(s, 4), 0.5);
  EXPECT_EQ(lr_multiplier(s, 6), 0.0);
  EXPECT_EQ(lr_multiplier(s, 9), 0.0);  // clamps at 0 past the horizon
}

// schedule-horizon-in-micro-steps counts lengths in the micro-batches of
// the real windows (issue 44): 11 micro-batches an epoch at K = 4 are
// windows of 4, 4, 3, so the run's 6 steps over 2 epochs are 22
// micro-batches (len(loader) * epochs), not 24; K x L where K divides M.
TEST(Schedule, HorizonInMicroStepsOfPartialWindows) {
  ScheduleSpec s;
  s.kind = ScheduleKind::linear;
  s.warmup = 2;
  s.total = 6;
  const ScheduleSpec m = stretched(s, 4, 11);
  EXPECT_EQ(m.total, 22);
  EXPECT_EQ(m.warmup, 8);
  EXPECT_EQ(micro_length(3, 4, 11), 11);
  EXPECT_EQ(micro_length(4, 4, 11), 15);
  EXPECT_EQ(stretched(s, 4, 12).total, 24);  // K divides M
  EXPECT_EQ(stretched(s, 4).total, 24);      // M unknown: K x L
}

TEST(Schedule, CosineRisesAgainPastHorizon) {
  ScheduleSpec s;
  s.kind = ScheduleKind::cosine;
  s.warmup = 0;
  s.total = 4;
  EXPECT_DOUBLE_EQ(lr_multiplier(s, 2), 0.5);
  EXPECT_NEAR(lr_multiplier(s, 4), 0.0, 1e-16);
  EXPECT_DOUBLE_EQ(lr_multiplier(s, 6), 0.5);  // 0.5*(1+cos(1.5 pi))
}

TEST(Schedule, StepAndStretch) {
  ScheduleSpec s;
  s.kind = ScheduleKind::step;
  s.step_size = 3;
  s.gamma = 0.5;
  EXPECT_EQ(lr_multiplier(s, 2), 1.0);
  EXPECT_EQ(lr_multiplier(s, 3), 0.5);
  const ScheduleSpec t = stretched(s, 4);
  EXPECT_EQ(lr_multiplier(t, 11), 1.0);
  EXPECT_EQ(lr_multiplier(t, 12), 0.5);
}

}  // namespace
}  // namespace accumcheck
