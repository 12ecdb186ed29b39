// The contract tier's EMA check (verify/contract/detail.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "oracle/error_model.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// The declared EMA (ContractRecorder.ema: meta.csv ema and ema_decay, the
// ema rows of rank 0; under DDP every rank keeps the same EMA): exactly one
// update after each optimizer step, none before the first, none between
// a window's backward passes and its step; each update d*prev + (1-d)*p
// with the parameters it saw within state_ema_ulps (the first may copy
// them: AveragedModel), error model contract_ema_ulps.  `pitfall` is set to
// ema-every-micro-step when updates come between the backward passes of a
// window.
CertifyCheck ema_check(const Trace& tr, const ContractSection& c,
                       std::string& pitfall) {
  CertifyCheck ck{"EMA", true, false, ""};
  const double d = std::strtod(tr.meta_value("ema_decay").c_str(), nullptr);
  const double ulps =
      d > 0 ? std::max(error_model::tolerance("contract_ema_ulps"),
                       2 + 3 * (1 - d) / d)
            : error_model::tolerance("contract_ema_ulps");
  const int64_t T = int64_t(c.steps[0].size());
  std::vector<const ContractEma*> ups;
  for (const auto& e : c.ema)
    if (e.rank == 0) ups.push_back(&e);
  std::map<int64_t, int64_t> per;  // steps done -> updates
  int64_t mid = 0, early = -1;
  for (const auto* e : ups) {
    ++per[e->version];
    if (e->since > 0 && !e->at_step) ++mid;
    if (e->at_step && early < 0) early = e->version;
  }
  std::string bad;
  for (int64_t v = 0; v <= T && bad.empty(); ++v) {
    const int64_t n = at_or_0(per, v);
    if (v == 0 && n > 0)
      bad = fmt::format("{} EMA update(s) before the first optimizer step", n);
    else if (v > 0 && n != 1)
      bad = fmt::format("{} EMA updates after optimizer step {} (expected 1)",
                        n, v - 1);
  }
  if (!bad.empty() && mid > 0) {
    bad += fmt::format(
        "; {} of {} updates between backward passes of a window: the EMA is "
        "updated every micro-step",
        mid, ups.size());
    pitfall = std::string(pitfall_id(Pitfall::ema_every_micro_step));
  } else if (early >= 0) {
    bad = fmt::format(
        "{}{}an EMA update between the backward passes of step {}'s window "
        "and optimizer.step(): the EMA averaged parameters the step had not "
        "yet moved (update it after optimizer.step())",
        bad, bad.empty() ? "" : "; ", early);
  }
  double worst = 0;
  std::string value_bad;
  for (size_t i = 0; i < ups.size(); ++i) {
    const ContractEma& e = *ups[i];
    double u = std::isnan(e.decay_u) ? kInf : e.decay_u;
    if (i == 0 && !std::isnan(e.copy_u)) u = std::min(u, e.copy_u);
    const double ratio = u / ulps;
    // The fitted decay to 3 digits: its last digits are float32 rounding
    // over the step's small change of the parameters (and the recorder's
    // sample of coordinates).
    if (ratio > 1 && value_bad.empty())
      value_bad = fmt::format(
          "EMA update {} (after {} optimizer steps): {:.3g} u32 of "
          "d|ema| + (1-d)|p| from ema = d*ema + (1-d)*p with the declared "
          "decay {:.6g} (bound {:g} u32); it moved as decay {:.3g}",
          i, e.version, u, d, ulps, e.fitted);
    worst = std::max(worst, ratio);
  }
  ck.ok = bad.empty() && value_bad.empty();
  if (ck.ok)
    ck.message = fmt::format(
        "{} EMA updates ({}, decay {:.6g}), one after each optimizer step: "
        "each d*ema + (1-d)*p of the stepped parameters within {} of the bound "
        "({:g} u32)",
        ups.size(), tr.meta_value("ema"), d, fmt_ratio(worst), ulps);
  else
    ck.message = bad.empty()
                     ? value_bad
                     : (value_bad.empty() ? bad : bad + "; " + value_bad);
  return ck;
}

}  // namespace accumcheck::contract_detail
