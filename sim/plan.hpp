// The schedule of one training run: epochs -> windows -> micro-batches ->
// rank shards of sample ids.  Identical for every engine.  make_plan() is
// lazy: an epoch's micro-batches are built when the trainer reaches it
// (and dropped after), so a large epoch count costs nothing until it runs
// and `--steps 1` makes any epoch count cheap.
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
#include <memory>
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
  int64_t accumulation = 1;  // K of this epoch (sim/k_schedule.hpp)
  int64_t micro_steps() const {
    int64_t n = 0;
    for (const auto& w : windows) n += int64_t(w.micro.size());
    return n;
  }
};

struct Plan {
  int64_t accumulation = 1;  // K of epoch 0 (EpochPlan: K per epoch)
  int64_t ranks = 1;         // R
  // Every epoch, built (hand-made plans, materialize()); empty for a lazy
  // plan (make_plan), whose epoch e is built when it is visited.
  std::vector<EpochPlan> epochs;
  std::shared_ptr<const Scenario> lazy;  // set: a lazy plan of this scenario
  bool large_batch = false;              // lazy: as_large_batch() of it

  int64_t epoch_count() const;
  // Epoch e, built (lazy) or copied.
  EpochPlan epoch(int64_t e) const;
  // Calls f(e, epoch) for each epoch in order until f returns false; a
  // lazy plan holds one epoch at a time.
  template <class F>
  void visit(F&& f) const {
    if (!lazy) {
      for (size_t e = 0; e < epochs.size(); ++e)
        if (!f(int64_t(e), epochs[e])) return;
      return;
    }
    for (int64_t e = 0; e < epoch_count(); ++e) {
      const EpochPlan ep = epoch(e);
      if (!f(e, ep)) return;
    }
  }
  // Windows over every epoch (lazy: computed without building; saturates
  // at INT64_MAX).
  int64_t windows() const;
};

// The accumulation plan of a scenario (lazy).
Plan make_plan(const Scenario& s);

// Every epoch of `p` built (tests and properties that index epochs).
Plan materialize(const Plan& p);

// The large-batch reference over the same windows: one process (R = 1),
// K = 1 and each window one micro-step holding all of the window's
// samples of every rank (DistributedSampler's padding duplicates
// included): what one device with memory for the window computes.  Lazy
// when `p` is.
Plan as_large_batch(const Plan& p);

// One epoch's order dealt out over R ranks as `sampler` says
// (scenario.hpp Sampler); shard 0 is the longest.
std::vector<std::vector<int64_t>> rank_shards(const std::vector<int64_t>& order,
                                              int64_t R, Sampler sampler);

// The epoch permutation (exposed for tests and export).
std::vector<int64_t> epoch_order(const Scenario& s, int64_t epoch);

}  // namespace accumcheck
