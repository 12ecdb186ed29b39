// The order-and-coverage check of certify on multi-rank (DDP) traces
// (verify/certify/drawn.cpp, drawn_plan_ranks): every rank's micro-batch shards
// from its forward_backward events, their union checked against the
// sampler's (padding repeats included), the trainer's own order judged on
// what it drew.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/certify/drawn.hpp"

namespace accumcheck {
namespace {

// scenarios/certify-ddp-2.toml's shape: 41 samples padded to 42 over 2
// ranks, b = 4, K = 4 (a full and a partial window per epoch), 2 epochs.
Scenario ddp_scenario(bool pinned) {
  std::string text = R"(story = "drawn ranks"
[model]
widths = [4, 8, 2]
activation = "tanh"
[data]
samples = 41
seed = 32
)";
  if (pinned) text += "pinned_order = true\n";
  text += R"([batching]
micro_batch = 4
accumulation = 4
epochs = 2
ranks = 2
[optimizer]
kind = "sgd"
lr = 0.2
)";
  return parse_scenario_string(text, "ddp.toml");
}

// What a DDP trainer that follows the plan records: one forward_backward
// event per rank and non-empty shard, in micro-step order.
TraceRun run_of(const Plan& plan) {
  TraceRun run;
  run.name = "trainer";
  for (int64_t e = 0; e < plan.epoch_count(); ++e) {
    int64_t micro = 0;
    for (const Window& w : plan.epoch(e).windows)
      for (const MicroBatch& mb : w.micro) {
        for (size_t r = 0; r < mb.shards.size(); ++r) {
          if (mb.shards[r].empty()) continue;
          TraceEvent te;
          te.event.kind = EventKind::forward_backward;
          te.event.epoch = e;
          te.event.micro = micro;
          te.event.rank = int64_t(r);
          te.event.sample_ids = mb.shards[r];
          run.events.push_back(std::move(te));
        }
        ++micro;
      }
  }
  return run;
}

// The events of (epoch, rank), in order.
std::vector<TraceEvent*> events_of(TraceRun& run, int64_t epoch, int64_t rank) {
  std::vector<TraceEvent*> out;
  for (TraceEvent& te : run.events)
    if (te.event.epoch == epoch && te.event.rank == rank) out.push_back(&te);
  return out;
}

TEST(DrawnRanks, ThePlanAsDrawnPasses) {
  const Scenario s = ddp_scenario(false);
  const Plan plan = materialize(make_plan(s));
  const DrawnPlan d = drawn_plan(s, plan, run_of(plan));
  EXPECT_TRUE(d.known);
  EXPECT_TRUE(d.ok) << d.message;
  EXPECT_FALSE(d.reordered);
  EXPECT_NE(d.message.find("every epoch draws every sample once over the 2 "
                           "ranks"),
            std::string::npos)
      << d.message;
}

TEST(DrawnRanks, TheTrainersOwnOrderIsJudgedOnWhatItDrew) {
  const Scenario s = ddp_scenario(false);
  const Plan plan = materialize(make_plan(s));
  TraceRun run = run_of(plan);
  // Rank 1 draws its first two micro-batches of epoch 0 the other way round.
  auto ev = events_of(run, 0, 1);
  ASSERT_GE(ev.size(), 2u);
  std::swap(ev[0]->event.sample_ids, ev[1]->event.sample_ids);
  const DrawnPlan d = drawn_plan(s, plan, run);
  EXPECT_TRUE(d.ok) << d.message;
  ASSERT_TRUE(d.reordered);
  const EpochPlan e0 = d.plan.epoch(0);
  EXPECT_EQ(e0.windows[0].micro[0].shards[1],
            plan.epoch(0).windows[0].micro[1].shards[1]);
  EXPECT_EQ(e0.windows[0].micro[0].shards[0],
            plan.epoch(0).windows[0].micro[0].shards[0]);
  EXPECT_EQ(e0.accumulation, 4);
  EXPECT_EQ(e0.windows.size(), plan.epoch(0).windows.size());
}

TEST(DrawnRanks, ASampleNeverDrawnAndOneDrawnTwiceAreNamed) {
  const Scenario s = ddp_scenario(false);
  const Plan plan = materialize(make_plan(s));
  TraceRun run = run_of(plan);
  auto r0 = events_of(run, 1, 0), r1 = events_of(run, 1, 1);
  const int64_t lost = r1[0]->event.sample_ids[0];
  const int64_t twice = r0[0]->event.sample_ids[0];
  r1[0]->event.sample_ids[0] = twice;  // rank 1 draws rank 0's sample
  const DrawnPlan d = drawn_plan(s, plan, run);
  EXPECT_TRUE(d.known);
  EXPECT_FALSE(d.ok);
  EXPECT_NE(d.message.find("epoch 1: sample " + std::to_string(lost) +
                           " never drawn on any rank"),
            std::string::npos)
      << d.message;
  // 41 samples padded to 42: one repeat is the sampler's, two are not.
  EXPECT_NE(d.message.find("epoch 1: 2 repeated draws"), std::string::npos)
      << d.message;
  EXPECT_NE(d.message.find(std::to_string(twice)), std::string::npos)
      << d.message;
  EXPECT_NE(d.message.find("the sampler's padding repeats 1"),
            std::string::npos)
      << d.message;
}

TEST(DrawnRanks, PaddingMayRepeatOtherSamplesUnderTheTrainersShuffle) {
  // DistributedSampler(shuffle=True) pads with the first samples of its
  // own permutation: the repeated sample differs from the plan's, the
  // count is the same.
  const Scenario s = ddp_scenario(false);
  const Plan plan = materialize(make_plan(s));
  TraceRun run = run_of(plan);
  // The plan's padding repeat in epoch 0, and a sample drawn once.
  std::map<int64_t, int> count;
  for (auto* te : events_of(run, 0, 0))
    for (int64_t id : te->event.sample_ids) ++count[id];
  for (auto* te : events_of(run, 0, 1))
    for (int64_t id : te->event.sample_ids) ++count[id];
  int64_t padded = -1, once = -1;
  for (auto [id, n] : count) {
    if (n == 2) padded = id;
    if (n == 1 && once < 0) once = id;
  }
  ASSERT_GE(padded, 0);
  // Replace one draw of the padded sample by a second draw of `once`.
  bool done = false;
  for (auto* te : events_of(run, 0, 1))
    for (int64_t& id : te->event.sample_ids)
      if (!done && id == padded) {
        id = once;
        done = true;
      }
  ASSERT_TRUE(done);
  const DrawnPlan d = drawn_plan(s, plan, run);
  EXPECT_TRUE(d.ok) << d.message;
  EXPECT_TRUE(d.reordered);
}

TEST(DrawnRanks, APinnedOrderMustBeKept) {
  const Scenario s = ddp_scenario(true);
  const Plan plan = materialize(make_plan(s));
  TraceRun run = run_of(plan);
  auto ev = events_of(run, 0, 1);
  std::swap(ev[0]->event.sample_ids, ev[1]->event.sample_ids);
  const DrawnPlan d = drawn_plan(s, plan, run);
  EXPECT_FALSE(d.ok);
  EXPECT_NE(d.message.find("micro-step 0 on rank 1"), std::string::npos)
      << d.message;
}

TEST(DrawnRanks, EventsWithoutSampleIdsLeaveTheCheckUnrun) {
  const Scenario s = ddp_scenario(false);
  const Plan plan = materialize(make_plan(s));
  TraceRun run = run_of(plan);
  run.events[3].event.sample_ids.clear();
  const DrawnPlan d = drawn_plan(s, plan, run);
  EXPECT_FALSE(d.known);
  EXPECT_NE(d.message.find("not checked: 1 of"), std::string::npos)
      << d.message;
}

}  // namespace
}  // namespace accumcheck
