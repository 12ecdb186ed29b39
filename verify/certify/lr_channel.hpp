// certify's lr channel: each optimizer step's lr, as the trainer read it
// from its optimizer at step time (the optimizer_step events' lr), judged
// against the accepted semantics' schedule.
//
// The accepted lr of step t is lr * S(n), n the scheduler.step() calls
// before it under the accepted semantics, computed in double exactly as
// PyTorch's LambdaLR does (base_lr * lambda(n), both Python floats;
// sim/lr_schedule.hpp writes the same formulas); the two agree to
// tolerance("lr_channel_rel") (a different libm's cos); a trace whose lr
// was held in float32 (lr_float32: meta.csv lr_precision = float32, as
// optax and Keras hold it) to tolerance("lr_channel_rel_float32").
//
// When they differ, the channel says what the lr sequence is, with its
// evidence: K x (or sqrt(K) x, or c x) the schedule at every step (the
// linear / square-root scaling rule), the schedule one step ahead
// (scheduler.step() before optimizer.step()), constant within each epoch
// at S(epoch) (scheduler stepped per epoch), or the first step that
// differs and by what ratio.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/scenario.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

struct LrChannel {
  bool checked = false;  // every optimizer_step event carries an lr
  bool ok = true;
  int64_t first_off = -1;  // first step whose lr is not the schedule's
  std::string message;     // one line
  std::string evidence;    // what the sequence is ("" when ok)
  std::vector<double> trace_lr, accepted_lr;  // per optimizer step
};

LrChannel check_lr(const Scenario& s, const Plan& plan, const TraceRun& run,
                   const Behavior& accepted, bool lr_float32 = false);

}  // namespace accumcheck
