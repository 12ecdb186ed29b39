// The schedule of one training run: epochs -> windows -> micro-batches ->
// rank shards of sample ids.  Produced once per scenario and identical for
// every engine.
//
// Per epoch: a seeded permutation of the n sample ids (identity when
// shuffle = false), sharded over R ranks as DistributedSampler does
// (padded by wrapping to a multiple of R, rank r takes every R-th id;
// or drop_last, or an unpadded split: batching.sampler);
// each rank's shard is cut into micro-batches of b (the last one short
// when b does not divide it); micro-step m holds every rank's m-th
// micro-batch; windows are K consecutive micro-steps, the last one
// partial (r < K) when K does not divide the micro-step count.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

struct MicroBatch {
  std::vector<std::vector<int64_t>> shards;  // [rank] -> sample ids
  int64_t items() const {
    int64_t n = 0;
    for (const auto& s : shards) n += int64_t(s.size());
    return n;
  }
};

struct Window {
  std::vector<MicroBatch> micro;
  bool partial = false;  // fewer than K micro-batches
  int64_t items() const {
    int64_t n = 0;
    for (const auto& m : micro) n += m.items();
    return n;
  }
};

struct EpochPlan {
  std::vector<Window> windows;
  int64_t micro_steps() const {
    int64_t n = 0;
    for (const auto& w : windows) n += int64_t(w.micro.size());
    return n;
  }
};

struct Plan {
  int64_t accumulation = 1;  // K
  int64_t ranks = 1;         // R
  std::vector<EpochPlan> epochs;
  int64_t windows() const {
    int64_t n = 0;
    for (const auto& e : epochs) n += int64_t(e.windows.size());
    return n;
  }
};

// The accumulation plan of a scenario.
Plan make_plan(const Scenario& s);

// The large-batch reference over the same windows: one process (R = 1),
// K = 1 and each window one micro-step holding all of the window's
// samples of every rank (DistributedSampler's padding duplicates
// included): what one device with memory for the window computes.
Plan as_large_batch(const Plan& p);

// One epoch's order dealt out over R ranks as `sampler` says
// (scenario.hpp Sampler); shard 0 is the longest.
std::vector<std::vector<int64_t>> rank_shards(const std::vector<int64_t>& order,
                                              int64_t R, Sampler sampler);

// The epoch permutation (exposed for tests and export).
std::vector<int64_t> epoch_order(const Scenario& s, int64_t epoch);

}  // namespace accumcheck
