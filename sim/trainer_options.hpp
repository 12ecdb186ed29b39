// What a Trainer (sim/trainer.hpp) is given and keeps besides the engine:
// its counters (optimizer and scheduler steps, windows, GradScaler's
// state), the options of a run (what is recorded, where it stops, the
// loss scale and skips certify forces), and the lr before any schedule.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

struct TrainerCounters {
  int64_t optimizer_steps = 0;  // optimizer.step() calls so far
  int64_t scheduler_steps = 0;  // scheduler.step() calls so far
  int64_t windows = 0;          // windows finished so far
  // GradScaler's state (loss scaling only): the scale is 2^scale_exp
  // (kNoScale: not started, the scenario's init_scale), and the clean
  // steps since the scale last changed.
  static constexpr int64_t kNoScale = INT64_MIN;
  int64_t scale_exp = kNoScale;
  int64_t growth_tracker = 0;
  int64_t skipped_steps = 0;  // steps the scaler skipped (inf/NaN)
};

struct TrainerOptions {
  bool record_values = true;  // keep grads/params per step and window
  bool record_events = true;
  int64_t max_steps = -1;  // stop after this many optimizer steps
  // Stop after this many windows (-1: none), so that a run which stops
  // stepping (a pitfall that never steps) ends too: run_experiment() sets
  // it to max_steps, the windows of the large-batch reference.
  int64_t max_windows = -1;
  // Teacher forcing of the loss scale (certify): the exponent e of the
  // scale 2^e of the backward passes of micro-step b (rank 0's backward
  // passes, 0-based over the run: every rank's pass of that micro-step) is
  // forced_scale_exp[b], the scale the trainer's own scaler used, as the
  // trace records it.  Non-empty turns loss scaling on whatever the
  // scenario says; the scaler still updates (its inf/NaN decisions, its
  // events), and each backward overrides its scale.  Beyond the last
  // entry the scaler's own scale is used.
  std::vector<int64_t> forced_scale_exp;
  // Teacher forcing of the scaler's skips (certify): the window whose
  // step_block() runs after backward pass count b (rank 0's, 0-based over
  // the run: Run::skipped's `backward`) is skipped when b is in
  // forced_skip (sorted), as the trace records that the trainer's scaler
  // found an inf/NaN there (an overflow the oracle, which holds no float16
  // or float32 range, cannot reproduce); a window the engine itself finds
  // overflowing is skipped too.
  std::vector<int64_t> forced_skip;

  // Neither values nor events recorded (the contract tier's predictions).
  static TrainerOptions unrecorded() {
    TrainerOptions o;
    o.record_values = false;
    o.record_events = false;
    return o;
  }
  // Events only (the contract tier's predictions under DDP count the
  // all-reduces each step holds).
  static TrainerOptions values_unrecorded() {
    TrainerOptions o;
    o.record_values = false;
    return o;
  }
};

// The trainer's lr before any schedule: the scenario's lr, scaled by K or
// sqrt(K) when the scenario teaches that advice.
inline double base_lr(const Scenario& s) {
  const double K = double(s.batching.accumulation);
  switch (s.trainer.lr_scaling) {
    case LrScaling::none:
      return s.optimizer.lr;
    case LrScaling::linear:
      return s.optimizer.lr * K;
    case LrScaling::sqrt:
      return s.optimizer.lr * std::sqrt(K);
  }
  return s.optimizer.lr;
}

}  // namespace accumcheck
