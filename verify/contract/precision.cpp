// The contract tier's low-precision judging (verify/contract/detail.hpp): a
// bfloat16 .grad's step bound, and whether a bfloat16 / float16 model's
// weights are read finely enough to tell the candidates apart.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "oracle/error_model.hpp"
#include "sim/errors.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// A step fit outside its float32 bound: a bf16 gradient buffer
// (low-precision-grad-buffer) when every consumed gradient is made of
// bfloat16 numbers (the recorder counts the elements bf16 cannot hold)
// and each residual is within the bf16 accumulation bound (error model
// unit_roundoff_bf16: each of the m terms rounded, m - 1 additions each
// rounded twice, u' = (1 + u32)(1 + u_bf16) - 1, gamma over m +
// contract_sum_ulps as for float32; underflow_bf16 per rounding, normwise
// over the n parameters).  Anything else changed .grad unseen: exit 2.
// Returns each step's bf16 bound, [rank][step], and says so in `sfit`;
// throws InputError where .grad does not accumulate in bfloat16.
std::vector<std::vector<double>> bf16_step_bound(
    const ContractSection& c, int64_t n,
    const std::vector<std::vector<double>>& step_bound, double worst_step,
    const std::string& trace_dir, CertifyCheck& sfit) {
  const double u = error_model::kUnitRoundoff32;
  const double sum_ulps = error_model::tolerance("contract_sum_ulps");
  std::vector<std::vector<double>> lowp_bound(size_t(c.ranks()));
  const double ub =
      (1 + u) * (1 + error_model::tolerance("unit_roundoff_bf16")) - 1;
  const double eta = error_model::tolerance("underflow_bf16");
  double worst_lowp = 0;
  int64_t off = 0, worst_t = 0, worst_q = 0;
  bool clipped_bf16 = false;
  for (int64_t q = 0; q < c.ranks(); ++q)
    for (size_t t = 0; t < c.steps[size_t(q)].size(); ++t) {
      const ContractStep& st = c.steps[size_t(q)][t];
      if (st.overflow) {  // no fit: the loss scaler check judges it
        lowp_bound[size_t(q)].push_back(0);
        continue;
      }
      // An engaged clip before the step that saw bfloat16 numbers only (the
      // recorder counted them): the bf16 buffer times its float32 factor,
      // one more float32 rounding (u32) of each element.
      bool clip_of_bf16 = false;
      for (const ContractClip& k : c.clips)
        if (k.rank == q && k.version == int64_t(t) && k.off_bf16 == 0 &&
            k.factor < 1)
          clip_of_bf16 = true;
      clip_of_bf16 = clip_of_bf16 && st.off_bf16 > 0;
      clipped_bf16 = clipped_bf16 || clip_of_bf16;
      const double m = double(st.terms) + sum_ulps;
      const double bound =
          (m * ub < 1 ? m * ub / (1 - m * ub) : kInf) * st.scale +
          std::sqrt(double(n)) * (2 * double(st.terms) + 1) * eta +
          (clip_of_bf16 ? u * st.scale : 0.0);
      lowp_bound[size_t(q)].push_back(bound);
      off = std::max(off, clip_of_bf16      ? 0
                          : st.off_bf16 < 0 ? n + 1
                                            : st.off_bf16);
      const double ratio = step_bound[size_t(q)][t] > 0
                               ? st.residual / step_bound[size_t(q)][t]
                               : kInf;
      if (ratio >= worst_step) {
        worst_t = int64_t(t);
        worst_q = q;
      }
      worst_lowp = std::max(worst_lowp, st.residual / bound);
    }
  const bool lowp = off == 0 && worst_lowp <= 1;
  if (lowp) {
    sfit.message += fmt::format(
        ": every consumed gradient is made of bfloat16 numbers and each "
        "residual is within the bf16 accumulation bound (max {}): .grad "
        "accumulates in bfloat16 (or is rounded to it before the step){}",
        fmt_ratio(worst_lowp),
        clipped_bf16 ? "; an engaged clip_grad_norm_ then scaled the bfloat16 "
                       "numbers it saw by its float32 factor"
                     : "");
  } else {
    const ContractStep& st = c.steps[size_t(worst_q)][size_t(worst_t)];
    throw InputError(
        trace_dir + "/contract.csv", 0, 0, "step",
        fmt::format(
            "{}step {}: the gradient optimizer.step() consumed is not made "
            "of the backward passes since the previous step (residual {} "
            "of its float32 bound; {}): .grad was changed by something the "
            "recorder did not see (a gradient hook registered before the "
            "recorder, an edit of .grad between backward and step, a "
            "buffer or a reduction in another precision). certify does not "
            "judge a loop "
            "on what it was not shown: make the recorder before any "
            "gradient hook, or remove the change, and record again",
            c.ranks() > 1 ? fmt::format("rank {} ", worst_q) : "", worst_t,
            fmt_ratio(worst_step),
            st.off_bf16 < 0
                ? std::string("the trace does not say whether it is bf16")
            : st.off_bf16 > 0 && worst_lowp <= 1
                // Within the bf16 bound, yet no bf16 .grad: what bf16
                // rounding after a float32 accumulation would give.
                ? fmt::format("{} of its {} elements are no bfloat16 "
                              "numbers: no bf16 gradient buffer; every step "
                              "is within the bf16 accumulation bound (max "
                              "{}), as bfloat16 rounding after a float32 "
                              "accumulation would be (a gradient reduction "
                              "in bfloat16? reduce in float32)",
                              st.off_bf16, n, fmt_ratio(worst_lowp))
                : st.off_bf16 > 0
                      ? fmt::format("{} of its {} elements are no bfloat16 "
                                    "numbers: no bf16 gradient buffer",
                                    st.off_bf16, n)
                      : fmt::format("bfloat16 numbers, but {} of the bf16 "
                                    "accumulation bound",
                                    fmt_ratio(worst_lowp))));
  }
  return lowp_bound;
}

// A bfloat16 / float16 model's weights are read to eps: its fit bound (a
// few u_bf16 of their value), or where every weight was read at the
// outputs against the float32 gradient rounded once (read_once), that
// reading's (contract_weight_read_ulps): whether that resolution tells correct
// accumulation (the ranking's first, the accepted semantics) apart from
// every other modelled candidate, i.e. each lies more than its uncertainty
// from the trace (candidates with correct's very prediction are its
// aliases, as in float32).  Where correct fits and another candidate fits
// too, the trace cannot back a verdict: exit 2.
CertifyCheck resolution_check(const CertifyReport& r,
                              const std::vector<double>& eps, double cal_max,
                              bool read_once, const std::string& trace_dir) {
  const bool correct_ok = r.ranking.front().distance <= 1;
  double eps_max = 0;
  for (const double e : eps) eps_max = std::max(eps_max, e);
  size_t near = 0;
  for (size_t k = 1; k < r.ranking.size(); ++k)
    if (near == 0 || r.ranking[k].distance < r.ranking[near].distance) near = k;
  const std::string read =
      read_once
          ? fmt::format(
                "{} forward and backward: each micro-batch weight read at "
                "its outputs to {:.3g} (the float32 gradient there rounded "
                "once to {}; its {} backward differs from float64 by {:.3g})",
                r.precision, eps_max, r.precision, r.precision, cal_max)
          : fmt::format(
                "{} forward and backward: each micro-batch gradient read to "
                "{:.3g} of its norm (its {} backward differs from float64 by "
                "{:.3g})",
                r.precision, eps_max, r.precision, cal_max);
  if (near == 0)
    return {"precision", true, false, read + "; no other candidate"};
  if (!correct_ok) return {"precision", true, false, read};
  const CertifyCandidate& other = r.ranking[near];
  if (other.distance <= 1)
    throw InputError(
        trace_dir + "/contract.csv", 0, 0, "calibration",
        fmt::format(
            "{}: at that resolution the weights fit {} (at {} of the "
            "uncertainty) as well as {} (at {}): the contract tier cannot "
            "tell them apart; certify a float32 run of the same loop",
            read, r.accepted, fmt_ratio(r.ranking.front().distance), other.name,
            fmt_ratio(other.distance)));
  return {"precision", true, false,
          fmt::format("{}; the nearest other candidate, {}, at {} of the "
                      "uncertainty",
                      read, other.name, fmt_ratio(other.distance))};
}

}  // namespace accumcheck::contract_detail
