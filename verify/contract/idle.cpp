// The contract tier's check of the optimizer calls that applied no update
// (verify/contract/detail.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// An optimizer call that applied no update (the trace's idle rows: a
// micro-step whose call only accumulated) moves nothing under correct
// accumulation: the parameters and the optimizer's state change only on
// the call that steps (exact: no tolerance; nothing is computed on them).
// One that moved them advanced the optimizer on a micro-step (AdamW's
// decoupled decay applied, Adam's moments decayed): `pitfall` is set to
// optimizer-state-every-micro-step.  nullopt where the trace has none.
std::optional<CertifyCheck> idle_check(const ContractSection& c,
                                       std::string& pitfall) {
  if (c.idle.empty()) return std::nullopt;
  int64_t moved = 0;
  const ContractIdle* first = nullptr;
  for (const ContractIdle& e : c.idle) {
    if (e.changed == 0 && e.state_changed <= 0) continue;
    ++moved;
    if (!first) first = &e;
  }
  const bool state =
      std::any_of(c.idle.begin(), c.idle.end(),
                  [](const auto& e) { return e.state_changed >= 0; });
  if (!first)
    return CertifyCheck{
        "calls without an update", true, false,
        fmt::format("{} optimizer call(s) on micro-steps that end no window "
                    "applied no update and moved nothing (the parameters{} "
                    "unchanged at the recorder's coordinates)",
                    c.idle.size(), state ? " and the optimizer's state" : "")};
  pitfall = std::string(pitfall_id(Pitfall::optimizer_state_every_micro_step));
  // What the first such call changed.  The parameters' change fitted as
  // -lambda * p is said as evidence (no decision is taken on it): a
  // residual near 0 is a decay, as a decoupled weight decay's
  // p -= lr * wd * p.
  std::string changed =
      fmt::format("{} of the sampled parameters", first->changed);
  if (first->changed > 0)
    changed +=
        fmt::format(" (by up to {:.3g} of |p|{})", first->worst,
                    std::isnan(first->lambda)
                        ? std::string()
                        : fmt::format(", as -lambda * p with lambda {:.4g}, "
                                      "relative residual {:.2g}: near 0, a "
                                      "decay, as a decoupled weight decay's "
                                      "p -= lr * wd * p",
                                      first->lambda, first->fit_residual));
  if (first->state_changed >= 0)
    changed += fmt::format(" and {} of the optimizer's sampled state values",
                           first->state_changed);
  return CertifyCheck{
      "calls without an update", false, false,
      fmt::format("{} of {} optimizer call(s) that applied no update moved "
                  "the parameters{}: micro-batch {}'s call (before optimizer "
                  "step {}) changed {}: the optimizer advanced on "
                  "micro-steps, not once per window",
                  moved, c.idle.size(),
                  state ? " or the optimizer's state" : "", first->micro,
                  first->version, changed)};
}

}  // namespace accumcheck::contract_detail
