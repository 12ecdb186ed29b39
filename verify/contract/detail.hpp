// Internal to the contract tier (verify/contract/contract.hpp): the parts of
// certify_contract(), one responsibility a file in verify/contract/.
//
//   contract.cpp   certify_contract: what meta.csv says, the checks below
//                  in order, every candidate judged (its distance, lr,
//                  all-reduces and clips) and the combination search;
//                  contract_text
//   fits.cpp       the fit checks: each backward's weight, each step's
//                  consumed gradient, the optimizer replay
//   weights.cpp    the measured weights and a candidate's distance from
//                  them
//   declared.cpp   what meta.csv declares: the accepted semantics, the lr
//                  schedule and clip, what is not judged
//   predict.cpp    the plan the trainer drew, a semantics' prediction on it
//                  (the coefficient engine through the one Trainer loop),
//                  the gradient all-reduces
//   clip.cpp       the clip check; the clip_grad_norm_ calls against a
//                  candidate's
//   ema.cpp        the EMA check
//   idle.cpp       the optimizer calls that applied no update
//   precision.cpp  a bfloat16 .grad's step bound; a low-precision model's
//                  resolution (the "precision" check)
//   diagnose.cpp   the verdict and, on FAIL, its diagnosis
//   evidence.cpp   the model-free evidence
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/run.hpp"
#include "sim/scenario.hpp"
#include "verify/certify/certify.hpp"
#include "verify/certify/lr_channel.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::contract_detail {

// ---- shared helpers

inline constexpr double kInf = std::numeric_limits<double>::infinity();
using Weights = std::map<int64_t, double>;  // micro-batch -> weight

// The keys of two maps, and a map's value at a key (0 where absent).
template <class V>
std::set<int64_t> keys_of(const std::map<int64_t, V>& a,
                          const std::map<int64_t, V>& b) {
  std::set<int64_t> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  return keys;
}
template <class V>
V at_or_0(const std::map<int64_t, V>& m, int64_t k) {
  const auto it = m.find(k);
  return it == m.end() ? V(0) : it->second;
}

inline std::string fmt_ratio(double x) {
  return std::isinf(x) ? std::string("inf") : fmt::format("{:.3g}", x);
}

// ---- declared.cpp

// The semantics the user accepted (meta.csv `accept`), in the catalog's
// order; InputError on an unknown pitfall id.
std::vector<Pitfall> accepted_semantics(const Trace& tr);

// The declared lr schedule and clip (meta.csv), into `s`.
void declared(const Trace& tr, Scenario& s);

// What the contract tier did not judge in this run.
// idle_rows: the trace's calls that applied no update were checked.
std::string not_judged(const Trace& tr, bool idle_rows = false);

// ---- predict.cpp

// The plan the trainer drew: each epoch's micro-batches in order, plus
// the ones its loader should have drawn and did not; windows of K.  A
// micro-batch m's shard holds ids m*S .. m*S + rows - 1.  With R ranks
// (a DDP trace) micro-step k holds every rank's k-th micro-batch of the
// epoch, as DDP's lockstep runs them.
struct ContractPlan {
  Plan plan;
  int64_t stride = 1;
  std::vector<int64_t> items;  // per micro-batch (drawn, then missing)
  // Per micro-batch, its items over the unshifted labels; -1: unknown.
  std::vector<int64_t> unshifted;
  int64_t drawn = 0;
  int64_t micro_batch = 1;
};

// InputError (at `path`) on uneven inputs across ranks.
ContractPlan contract_plan(const ContractSection& c, int64_t K,
                           const std::string& path);

// Step -> the micro-steps of its gradient all-reduces, in order.
using Reduces = std::map<int64_t, std::vector<int64_t>>;

struct Prediction {
  // [rank][step]
  std::vector<std::vector<Weights>> P;
  // [rank][step]: micro-batch -> the parameter version of its g_j
  std::vector<std::vector<std::map<int64_t, int64_t>>> version;
  Reduces reduces;  // step -> the micro-steps of its gradient all-reduces
  // (rank, parameter version) -> its clip_grad_norm_ calls (ClipCalls)
  std::map<std::pair<int64_t, int64_t>, int64_t> clips;
  // The drawn micro-batches the loop backwards but steps in no optimizer
  // step (an epoch's leftover left in .grad at the run's end, say);
  // a drawn micro-batch in no step and not here is never backwarded (a
  // window buffer's last leftover).
  std::set<int64_t> unstepped_backward;
};

// "" when the trace backwards exactly the drawn micro-batches `pred`
// backwards without stepping, among those `pred` steps in no step; else
// the first that differs.
std::string unstepped_differ(const ContractPlan& cp, const ContractSection& c,
                             const Prediction& pred);

// The gradient all-reduces of a contract trace's events.
Reduces all_reduces(const std::vector<Event>& events, const ContractSection& c);

// "" when equal, else the first step whose all-reduces differ.
std::string reduces_differ(const Reduces& trace, const Reduces& pred);

// Behavior b's prediction on the trace's plan.
Prediction predict(const ContractPlan& cp, const Scenario& s, const Behavior& b,
                   const ContractSection& c);

// The performance-only pitfall whose all-reduces are the trace's; "" when
// none.
std::string performance_finding(const ContractPlan& cp, const Scenario& s,
                                const std::vector<Pitfall>& accept,
                                const ContractSection& c,
                                const Prediction& pred, const Reduces& trace,
                                const std::string& accepted);

// ---- weights.cpp

struct Measured {
  // [rank][step]: weight and its uncertainty.
  std::vector<std::vector<Weights>> W, U;
};

struct Distance {
  double d = 0;
  int64_t step = -1, micro = -1;
  std::string why;
  // The weights beyond their uncertainty (over the steps both take; each
  // weight of a step only one takes counts too) and the sum of their
  // excess ratios (capped at kResidualCap each): the combination search's
  // measure of what a candidate leaves unexplained.
  Residual residual;
};

// Per rank, W_t = beta W_{t-1} + sum_b a_b w_b e_{m(b)} (b over every
// rank's backward passes: DDP's all-reduce brings the others'), with the
// uncertainty propagated from each backward's fit bound eps and each
// step's fit bound step_bound[rank][step].
Measured compose(const ContractSection& c, const std::vector<double>& eps,
                 const std::vector<std::vector<double>>& step_bound);

// A prediction's distance from the measured weights.
Distance distance(const Measured& m, const Prediction& p,
                  const ContractSection& c);

// ---- fits.cpp

// 1. Each backward's gradient fitted as w_b * g_j, against its calibrated
// bound: the check, each backward's bound (eps) and the largest
// calibration.  InputError where a float32 model's float64 recompute
// strays past evidence_weight_rel (not the forward the loop ran).
struct WeightFit {
  CertifyCheck check;
  std::vector<double> eps;  // per backward, its fit's bound
  double cal_max = 0;
};
WeightFit weight_fit_check(const ContractSection& c, double u_model,
                           bool lowp_model, const std::string& trace_dir);

// 2. Each step's consumed gradient as a combination of what .grad held:
// the check, each step's bound [rank][step] and, where the float32 fit
// failed, a bfloat16 .grad's (bf16_step_bound; InputError where .grad
// does not accumulate in bfloat16).  n: the model's parameters.
struct StepFit {
  CertifyCheck check;
  std::vector<std::vector<double>> bound, lowp_bound;
  bool lowp = false;  // .grad accumulates in bfloat16
  double worst = 0;   // the worst residual, in float32 bounds
};
StepFit step_fit_check(const ContractSection& c, int64_t n,
                       const std::string& ranks_said,
                       const std::string& trace_dir);

// 3. The optimizer update, replayed in float64 (meta.csv replay says
// against what).
CertifyCheck replay_check(const Trace& tr, const ContractSection& c);

// ---- clip.cpp

// The clip_grad_norm_ calls against the declared clip (n parameters);
// by_shard: on each rank's shard's norm (ddp-clip-local-norm).
CertifyCheck clip_check(const ContractSection& c, const Scenario& s, int64_t n,
                        bool by_shard = false);

// (rank, parameter version) -> its clip_grad_norm_ calls.
using ClipCalls = std::map<std::pair<int64_t, int64_t>, int64_t>;

// The trace's clip_grad_norm_ calls.
ClipCalls clip_calls(const ContractSection& c);

// A declared clip's call pattern is each candidate's own (clip after every
// backward calls it K times a step), judged even where a clip that never
// engages leaves the weights the same: "" when the trace's calls are the
// prediction's, else the first (rank, step) where they differ.
std::string clip_calls_differ(const ClipCalls& trace, const ClipCalls& pred,
                              int64_t ranks);

// ---- scaler.cpp

// The windows whose gradient overflowed (the trace's overflow rows): each
// skipped by the loss scaler, for an overflow of its own, nothing updated,
// the scale backed off.  nullopt where the trace has none.
std::optional<CertifyCheck> scaler_check(const ContractSection& c);

// ---- idle.cpp

// The optimizer calls that applied no update (the trace's idle rows): each
// moved nothing; `pitfall` set to optimizer-state-every-micro-step where
// one did.  nullopt where the trace has none.
std::optional<CertifyCheck> idle_check(const ContractSection& c,
                                       std::string& pitfall);

// ---- ema.cpp

// The declared EMA; `pitfall` set to the pitfall its updates show.
CertifyCheck ema_check(const Trace& tr, const ContractSection& c,
                       std::string& pitfall);

// ---- precision.cpp

// A float32 step fit that failed: each step's bound of a bfloat16 .grad;
// InputError where .grad does not accumulate in bfloat16.
std::vector<std::vector<double>> bf16_step_bound(
    const ContractSection& c, int64_t n,
    const std::vector<std::vector<double>>& step_bound, double worst_step,
    const std::string& trace_dir, CertifyCheck& sfit);

// A low-precision model's "precision" check over the ranking; InputError
// where its resolution cannot tell correct from another candidate.
CertifyCheck resolution_check(const CertifyReport& r,
                              const std::vector<double>& eps, double cal_max,
                              bool read_once, const std::string& trace_dir);

// ---- diagnose.cpp

// What certify_contract's checks and ranking found, for the verdict.
struct Findings {
  bool checks_ok = false;     // weight fit, step fit, optimizer replay, clip
  bool structure_ok = false;  // correct's weights within their uncertainty
  bool ema_ok = true;
  std::string ema_pitfall;     // ema_check's
  bool scaler_ok = true;       // scaler_check's
  bool idle_ok = true;         // idle_check's
  std::string idle_pitfall;    // idle_check's
  bool replay_ok = true;       // the optimizer replay (in checks_ok)
  bool idle_rows = false;      // the trace has idle rows
  bool fits_ok = false;        // weight fit, step fit, clip (no replay)
  Distance correct_weights;    // correct's weight distance, whatever its lr
  LrChannel lr_correct;        // correct's lr channel
  std::string reduce_correct;  // "" or how correct's all-reduces differ
  bool horizon_unjudged = false;
  std::string ranks_said;
  // Per candidate (r.ranking's order before sorting): its weight distance
  // whatever its lr, and whether its lr is the trace's.
  std::vector<double> weight_d;
  std::vector<bool> lr_ok;
};

// r.pass, r.verdict and r.diagnosis (the ranking sorted, or cleared where
// it is not printed); `accepted` is the accepted semantics' prediction.
void conclude(CertifyReport& r, const Trace& tr, const ContractSection& c,
              const ContractPlan& cp, const Scenario& s,
              const std::vector<Pitfall>& accept, int64_t K,
              const Measured& meas, const Prediction& accepted,
              const Findings& f);

// ---- evidence.cpp

// Model-free evidence: the first step whose weights leave the accepted
// semantics' (`correct`, named `accepted`) by more than their uncertainty
// U, as the verdict judges them.
std::vector<std::string> contract_evidence(const ContractSection& c,
                                           const std::vector<Weights>& W,
                                           const std::vector<Weights>& U,
                                           const std::vector<Weights>& correct,
                                           int64_t K,
                                           const std::string& accepted);

}  // namespace accumcheck::contract_detail
