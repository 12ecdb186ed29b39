// The contract tier's loss scaler check (verify/contract/detail.hpp).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// A window whose gradient held inf or NaN (an overflow row,
// accumcheck_torch/scaler.py) is in no optimizer step under correct
// accumulation with a loss scaler: torch.amp.GradScaler.step finds the
// overflow and updates nothing, and update() multiplies the scale by the
// scaler's backoff factor.  Each such window must have overflowed by itself
// (one of its own backward passes holds inf or NaN; none: .grad kept an
// earlier skipped window's gradient, no zero_grad() after it), been
// skipped (not stepped past the scaler), changed none of the sampled
// parameters and optimizer state, and the scale after update() must be
// the scale times the backoff factor, in float32 as GradScaler computes it
// (exact: no tolerance).
std::optional<CertifyCheck> scaler_check(const ContractSection& c) {
  int64_t windows = 0;
  std::string why;
  for (int64_t q = 0; q < c.ranks(); ++q)
    for (size_t t = 0; t < c.steps[size_t(q)].size(); ++t) {
      const auto& o = c.steps[size_t(q)][t].overflow;
      if (!o) continue;
      ++windows;
      if (!why.empty()) continue;
      const std::string at = fmt::format(
          "{}step {}", c.ranks() > 1 ? fmt::format("rank {} ", q) : "", t);
      const float want =
          float(o->scale_before) * float(o->backoff);  // GradScaler's float32
      if (!o->skipped)
        why = fmt::format(
            "{}: the optimizer stepped on a gradient holding inf or NaN ({} "
            "of the window's {} backward passes overflowed): no loss scaler "
            "skipped the window (optimizer.step() called past "
            "GradScaler.step(optimizer))",
            at, o->own, o->passes);
      else if (o->own == 0)
        why = fmt::format(
            "{}: skipped for overflow, but none of the window's {} backward "
            "passes overflowed: the inf or NaN is an earlier skipped "
            "window's gradient left in .grad (zero_grad() after every "
            "window, skipped or not)",
            at, o->passes);
      else if (o->changed != 0)
        why = fmt::format(
            "{}: the skipped step changed {} of the parameters' and optimizer "
            "state's values at the recorder's coordinates (a skipped window "
            "updates nothing)",
            at,
            o->changed < 0 ? std::string("an unmeasured number")
                           : std::to_string(o->changed));
      else if (std::isnan(o->scale_after))
        why = fmt::format(
            "{}: skipped for overflow, and no scaler.update() came before "
            "the next step: the scale stayed {} (update() after every "
            "scaler.step())",
            at, o->scale_before);
      else if (float(o->scale_after) != want)
        why = fmt::format(
            "{}: the loss scale went from {} to {} at the skip; the "
            "scaler's backoff factor {} gives {}",
            at, o->scale_before, o->scale_after, o->backoff, want);
    }
  if (windows == 0) return std::nullopt;
  if (!why.empty()) return CertifyCheck{"loss scaler", false, false, why};
  return CertifyCheck{
      "loss scaler", true, false,
      fmt::format("{} window(s) with inf or NaN, each its own overflow, "
                  "skipped by the loss scaler: nothing updated (the "
                  "parameters and optimizer state unchanged at the "
                  "recorder's coordinates), the scale times its backoff "
                  "factor; their micro-batches in no step",
                  windows)};
}

}  // namespace accumcheck::contract_detail
