// certify's checks of the training state beyond gradients and parameters
// (issue 13): the trace's state.csv (verify/trace.hpp, read by
// read_state), judged after the gradients and parameters.
//
//   loss scale      the loss scale of every backward pass: constant within
//                   a window (a scaler updated every micro-step changes
//                   it: scaler-update-every-micro-step); a window skipped
//                   for overflow must not step the scheduler
//                   (skipped-step-advances-scheduler)
//   optimizer state state['step'] after step t is t + 1, exactly (once per
//                   micro-batch: optimizer-state-every-micro-step); Adam's
//                   moments replayed from the recorded moments and
//                   gradients on the Tracked oracle, within its bound
//   EMA             one update per optimizer step, after it (every
//                   micro-step: ema-every-micro-step); each update
//                   replayed in float64 from the recorded EMA and
//                   parameters within error_model's state_ema_ulps (the
//                   first: a copy of the parameters, AveragedModel, or
//                   an update of the initial ones, an EMA started there)
//   BatchNorm stats num_batches_tracked = the training forwards so far,
//                   exactly; running_mean and running_var replayed on the
//                   Tracked oracle from the recorded statistics and
//                   parameters over the window's micro-batches
//   logged loss     the loss the trainer logs for a window against the
//                   window's mean item loss (Tracked oracle plus
//                   logged_loss_ulps): a check of its own (separate),
//                   never a training FAIL; a wrong log is named (K x the
//                   mean, the last micro-batch only)
//
// The pattern ids named here are sim/pitfalls' catalog ids for these
// behaviours (issue 13 part 3): each finding starts with the pitfall's
// pitfall_id.
#pragma once

#include <string_view>
#include <vector>

#include "verify/certify_stages.hpp"

namespace accumcheck::certify_detail {

// The names of the checks check_state adds.
inline constexpr std::string_view kStateChecks[] = {
    "loss scale", "skipped steps",        "optimizer state",
    "EMA",        "BatchNorm statistics", "logged loss"};
inline bool is_state_check(std::string_view name) {
  for (std::string_view n : kStateChecks)
    if (n == name) return true;
  return false;
}

// Appends the state checks of the trace (when it has state.csv) to
// r.checks, and one line per named pattern to `findings`
// ("state finding: <id>: <what>").  forward_scale: the gradient bound's
// scale of the trainer's precision (1 for float32, bf16_bound_scale under
// bfloat16 autocast), applied to forwards (BatchNorm statistics, logged
// loss).
void check_state(const Ctx& c, const LoadedTrace& L, double forward_scale,
                 CertifyReport& r, std::vector<std::string>& findings);

}  // namespace accumcheck::certify_detail
