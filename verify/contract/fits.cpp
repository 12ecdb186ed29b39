// The contract tier's fit checks (verify/contract/detail.hpp): each
// backward's gradient as w_b * g_j, each step's consumed gradient as a
// combination of what .grad held, and the optimizer's update replayed,
// each against its bound from the error model's contract_* rows.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "oracle/error_model.hpp"
#include "sim/errors.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

WeightFit weight_fit_check(const ContractSection& c, double u_model,
                           bool lowp_model, const std::string& trace_dir) {
  WeightFit out;
  const double fit_cal = error_model::tolerance("contract_fit_calibration");
  const double fit_ulps = error_model::tolerance("contract_fit_ulps");
  double& cal_max = out.cal_max;
  size_t cal_at = 0;
  for (size_t j = 0; j < c.micro.size(); ++j)
    if (!std::isnan(c.micro[j].calibration) &&
        c.micro[j].calibration > cal_max) {
      cal_max = c.micro[j].calibration;
      cal_at = j;
    }
  // A float64 recompute of g_j that strays from the float32 one by more
  // than the precision at which weights are read (evidence_weight_rel):
  // either not the same function (randomness the recorder could not
  // replay, such as a compiled graph's own RNG) or float32's own error
  // (g_j small beside the per-sample gradients it sums, as a model near
  // its minimum: cancellation).  Either way the weights would be too
  // uncertain to tell correct from a mistake, so the trace is not judged.
  const double weight_rel = error_model::tolerance("evidence_weight_rel");
  if (cal_max > weight_rel && !lowp_model)
    throw InputError(
        trace_dir + "/contract.csv", 0, 0, "calibration",
        fmt::format(
            "micro-batch {}'s gradient recomputed in float64 differs from "
            "the float32 one by {:.3g} of its norm (at most {:g} reads a "
            "weight). Either the recompute is not the forward your loop ran "
            "(randomness the recorder could not replay, e.g. a "
            "torch.compile'd model compiled before the recorder was made: "
            "record again with the recorder made first), or float32 itself "
            "strays this far there (the gradient small beside the "
            "per-sample gradients it sums, as a model near its minimum: "
            "record the run's earlier steps, or in float64)",
            cal_at, cal_max, weight_rel));
  std::vector<double>& eps = out.eps;
  CertifyCheck& fit = out.check;
  fit = {"weight fit", true, false, ""};
  double worst_fit = 0;
  int64_t worst_b = -1;
  // A backward pass of a window whose gradient overflowed: in no step, its
  // fit of inf or NaN not judged (the loss scaler check is its).
  const auto overflowed = [&](const ContractBackward& bw) {
    const ContractMicro& m = c.micro[size_t(bw.micro)];
    const auto& steps = c.steps[size_t(m.rank)];
    return bw.version >= 0 && bw.version < int64_t(steps.size()) &&
           steps[size_t(bw.version)].overflow.has_value();
  };
  for (size_t b = 0; b < c.backward.size(); ++b) {
    const ContractBackward& bw = c.backward[b];
    const double cal = c.micro[size_t(bw.micro)].calibration;
    const double bound =
        fit_cal * (std::isnan(cal) ? cal_max : cal) + fit_ulps * u_model;
    eps.push_back(bound);
    if (overflowed(bw)) continue;
    const double ratio = std::isnan(bw.residual) ? kInf : bw.residual / bound;
    if (ratio > worst_fit || worst_b < 0) {
      worst_fit = ratio;
      worst_b = int64_t(b);
    }
  }
  if (worst_b >= 0) {
    const auto& bw = c.backward[size_t(worst_b)];
    fit.ok = worst_fit <= 1;
    fit.message = fmt::format(
        "{} backward passes, each w*g_j: worst residual {:.3g} = {} of its "
        "bound "
        "(backward {}, micro-batch {})",
        c.backward.size(), bw.residual, fmt_ratio(worst_fit), worst_b,
        bw.micro);
    if (!fit.ok)
      fit.message +=
          ": that gradient is not a multiple of the micro-batch's g_j "
          "(another loss than the declared summed loss, other "
          "randomness, or the gradient changed inside the backward)";
  } else {
    fit.ok = false;
    fit.message = "no backward pass recorded";
  }
  return out;
}

StepFit step_fit_check(const ContractSection& c, int64_t n,
                       const std::string& ranks_said,
                       const std::string& trace_dir) {
  StepFit out;
  const double u = error_model::kUnitRoundoff32;
  const double sum_ulps = error_model::tolerance("contract_sum_ulps");
  // With R ranks the b run over every rank's backward passes (DDP's
  // all-reduce brings them), each rank's step fitted on its own.
  std::vector<std::vector<double>>& step_bound = out.bound;
  step_bound.resize(size_t(c.ranks()));
  CertifyCheck& sfit = out.check;
  sfit = {"step fit", true, false, ""};
  double& worst_step = out.worst;
  for (int64_t q = 0; q < c.ranks(); ++q)
    for (const auto& st : c.steps[size_t(q)]) {
      if (st.overflow) {  // no fit: the loss scaler check judges it
        step_bound[size_t(q)].push_back(0);
        continue;
      }
      const double bound = (double(st.terms) + sum_ulps) * u * st.scale;
      step_bound[size_t(q)].push_back(bound);
      const double ratio =
          bound > 0 ? st.residual / bound : (st.residual == 0 ? 0 : kInf);
      worst_step = std::max(worst_step, ratio);
    }
  sfit.ok = worst_step <= 1;
  sfit.message = fmt::format(
      "{} optimizer steps{}, each consumed gradient = beta*G_prev + sum a_b "
      "c_b: worst residual {} of its bound",
      c.steps[0].size(), ranks_said, fmt_ratio(worst_step));
  // A step fit outside its float32 bound: .grad accumulates in bfloat16
  // (bf16_step_bound, precision.cpp), or .grad was changed unseen: exit 2.
  out.lowp_bound.resize(size_t(c.ranks()));
  if (!sfit.ok) {
    out.lowp_bound =
        bf16_step_bound(c, n, step_bound, worst_step, trace_dir, sfit);
    out.lowp = true;
  }
  return out;
}

CertifyCheck replay_check(const Trace& tr, const ContractSection& c) {
  const double replay_ulps = error_model::tolerance("contract_replay_ulps");
  CertifyCheck rep{"optimizer replay", true, false, ""};
  double worst_rep = 0;
  for (const auto& steps : c.steps)
    for (const auto& st : steps)
      if (!st.overflow)
        worst_rep = std::max(
            worst_rep, std::isnan(st.replay) ? kInf : st.replay / replay_ulps);
  rep.ok = worst_rep <= 1;
  // What the recorder replayed its update against (meta.csv replay: each
  // recorder says it in its own words; the check is the same).
  const std::string replayed = tr.meta_value("replay");
  rep.message = fmt::format(
      "{}: worst {} of the bound ({} u32 of |p| + |update|)",
      replayed.empty() ? "the optimizer's update replayed from the recorded "
                         "parameters, state and gradient"
                       : replayed,
      fmt_ratio(worst_rep), replay_ulps);
  return rep;
}

}  // namespace accumcheck::contract_detail
