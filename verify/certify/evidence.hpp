// Model-free evidence for a trace no modelled pitfall explains (certify's
// diagnosis, after "no modelled pitfall explains this trace").
//
//   - the first step out of the bound, the tensor, and the first
//     micro-batch of its window whose weight is not the accepted one;
//   - the effective weight of each micro-batch of that window, fitted from
//     the trace: the trace's gradient G of the step (less the accepted
//     L2-in-loss term) as the least-squares combination sum_k w_k g_k of
//     the window's per-micro-batch gradients g_k (sum of item losses,
//     computed by a double oracle at the trace's parameters before the
//     step; the step's clip, from its clip event's pre-clip norm, undone),
//     printed as fractions of 1/N_w: "micro-batch 0 weighs 2/N_w:
//     counted twice", "weighs 0: skipped", "weights 1/(K*b_k)"; a fit whose
//     residual is not small says so (the gradient is no combination of
//     this window's micro-batches);
//   - the lr channel's evidence (verify/certify/lr_channel.hpp);
//   - the step-count difference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/data.hpp"
#include "sim/layout.hpp"
#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/scenario.hpp"
#include "verify/certify/lr_channel.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

struct EvidenceInput {
  const Scenario& s;
  const Dataset& data;
  const std::vector<float>& init;
  const Plan& plan;  // the plan judged on
  const ParamLayout& layout;
  const std::vector<TraceStep>& trace;
  const TraceRun& run;
  const Behavior& accepted;
  std::string accepted_name;
  int64_t first_out = -1;  // the accepted semantics' first step out
  std::string first_out_what;
  int64_t trace_steps = 0, expected_steps = 0;
  const LrChannel& lr;
};

// Effective weights of one step's micro-batches, fitted from the trace.
struct WindowFit {
  bool fitted = false;
  int64_t step = -1;
  int64_t items = 0;                 // N_w
  std::vector<int64_t> micro_items;  // b_k
  std::vector<double> weight;        // w_k (per unit of summed item loss)
  double residual = 0;               // |G - sum w_k g_k| / |G|
  double clip_coef = 1;  // the step's clip factor, undone before the fit
};

// `window` >= 0: fit the step's gradient over that window's micro-batches
// instead of the one the accepted semantics gives the step (where a
// micro-batch of an earlier window was stepped).
WindowFit fit_window(const EvidenceInput& in, int64_t step,
                     int64_t window = -1);

// The evidence lines, each without a trailing newline.
std::vector<std::string> unexplained_evidence(const EvidenceInput& in);

// One optimizer step's window as the run recorded it: the epoch of the
// step, the micro-batches rank 0 backwarded since the step before it (one
// backwarded twice counts once: a double count is not a larger K), and
// the K declared for that epoch (the scenario's, or the contract
// recorder's `accumulation`).
struct RunWindow {
  int64_t epoch = 0;
  int64_t backward = 0;
  int64_t declared = 1;
};

// When the run's windows are not the declared K's: "" when they are (or
// when they have no one size the evidence can name), else the line
// "windows: ...: the run looks like K = K'".  An epoch's windows have one
// size K' when every window but the epoch's last holds K' micro-batches
// and the last at most K' (a partial window); an epoch of one window says
// nothing of its K.  Named when every epoch that says something has the
// same K' and the declared K differs in one of them.  `declared_by` says
// who declared it ("the scenario declares": "... K = 4").
std::string windows_evidence(const std::vector<RunWindow>& windows,
                             const std::string& declared_by);

// The K the run's windows look like (windows_evidence's K'), 0 when
// they have none or it is the declared one.
int64_t windows_k(const std::vector<RunWindow>& windows);

// The oracle tier's windows: rank 0's micro-batches (forward_backward
// events, by their sample ids) before each of its optimizer steps (the
// first `steps`), each step's epoch and the plan's K of that epoch.
std::vector<RunWindow> trace_windows(const TraceRun& run, const Plan& plan,
                                     int64_t steps);

}  // namespace accumcheck
