// certify's checks of the training state beyond gradients and parameters
// (issue 13): the trace's state.csv (verify/trace/trace.hpp, read by
// read_state), judged after the gradients and parameters.
//
//   loss scale      the loss scale of every backward pass: constant within
//                   a window (a scaler updated every micro-step changes
//                   it: scaler-update-every-micro-step); a window skipped
//                   for overflow must not step the scheduler
//                   (skipped-step-advances-scheduler)
//   optimizer state state['step'] after step t is t + 1, exactly (once per
//                   micro-batch: optimizer-state-every-micro-step)
//   moments         Adam's moments after each judged step replayed from
//                   the recorded ones before it and the step's gradient
//                   on the Tracked oracle, within its bound: step checks
//                   ("step t exp_avg", "step t exp_avg_sq", judge_moments
//                   in forced_run), so --steps and parts judge their own
//                   steps only
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

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include "verify/certify/stages.hpp"

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

// Adam's recorded moments by step (values.bin blocks and state.csv rows,
// taken out of the state section), for judge_moments.
struct RecordedMoments {
  std::map<int64_t, TraceValues> exp_avg, exp_avg_sq;
};
RecordedMoments take_moments(StateSection& st, const ParamLayout& layout);

// Teacher forcing of Adam's state, as of the gradients and parameters:
// before step t's optimizer step, the oracle's moments `m`, `v` are set
// to the trainer's recorded moments of step t - 1 (c.moments), so that
// the step's parameters and moments are predicted from the state the
// trainer stepped from, not from the oracle's own earlier steps.  The
// caller forces only from recorded moments that judge_moments found
// within the bound: moments recorded wrong (a trace edited, a recorder
// that saw another optimizer) then fail at their own step and are not
// carried into the next step's parameters.  Left as they are where step
// t - 1 has no complete recorded moments, and for SGD.
template <class T>
void force_moments(const Ctx& c, int64_t t, std::vector<T>& m,
                   std::vector<T>& v);
// Whether step t has complete recorded moments (force_moments at t + 1
// then sets every element).
bool moments_recorded(const Ctx& c, int64_t t);
// After step t: its recorded moments against the oracle's `m`, `v` (the
// update from the recorded ones of step t - 1 where they were forced, the
// trace's gradient of step t and, for Adam's coupled weight decay, its
// parameters before it).  Sets ev.exp_avg and ev.exp_avg_sq, and returns
// whether both are within the bound; leaves them empty and returns false
// where the step has no complete recorded moments.
template <class T>
bool judge_moments(const Ctx& c, int64_t t, const std::vector<T>& m,
                   const std::vector<T>& v, StepEval& ev);
#define ACCUMCHECK_MOMENTS(T)                                                 \
  extern template void force_moments<T>(const Ctx&, int64_t, std::vector<T>&, \
                                        std::vector<T>&);                     \
  extern template bool judge_moments<T>(const Ctx&, int64_t,                  \
                                        const std::vector<T>&,                \
                                        const std::vector<T>&, StepEval&);
ACCUMCHECK_MOMENTS(TD)
ACCUMCHECK_MOMENTS(TR)
#undef ACCUMCHECK_MOMENTS

// Whether a step check is one of judge_moments' (its kind).
inline bool is_moment_check(const CertifyCheck& c) {
  return c.kind == "exp_avg" || c.kind == "exp_avg_sq";
}

// Appends the state checks of the trace (its state section `st`, read
// with read_state; moments taken) to r.checks, and one line per named
// pattern to `findings` ("state finding: <id>: <what>").  forward_scale:
// the gradient bound's scale of the trainer's precision (1 for float32,
// bf16_bound_scale under bfloat16 autocast), applied to forwards
// (BatchNorm statistics, logged loss).
void check_state(const Ctx& c, const LoadedTrace& L, StateSection& st,
                 double forward_scale, CertifyReport& r,
                 std::vector<std::string>& findings);

}  // namespace accumcheck::certify_detail
