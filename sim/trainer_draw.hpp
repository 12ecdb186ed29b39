// The windows an epoch is cut into where a pitfall draws or cuts them
// differently from the plan (sim/trainer.hpp's loop walks the plan's
// otherwise): skip-short-micro-batch, window-boundary-off-by-one (and
// -max-steps), window-counter-across-epochs, last-fetch-sized-in-samples,
// window-buffer-across-epochs (buffered_epoch, after drawn_epoch),
// window-sum-across-epochs (joined_epoch, after drawn_epoch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"

namespace accumcheck {

// Whether a trainer of behaviour `b` draws or cuts an epoch's windows
// itself (drawn_epoch) rather than walking the plan's.
inline bool draws_own_windows(const Behavior& b) {
  return b.skip_short_micro_batch || b.window_off_by_one ||
         b.windows_across_epochs || b.last_fetch_in_samples ||
         b.buffer_across_epochs || b.sum_across_epochs;
}

// The epoch's windows as a trainer of behaviour `b` draws and cuts them
// (K: the epoch's; micro_batch: the scenario's micro-batch size;
// micro_before_epoch: the micro-batches drawn in the epochs before this
// one, window-counter-across-epochs' count); `unfinished`:
// last-fetch-sized-in-samples left the epoch's last micro-batches
// undrawn, so its last window never reaches the epoch's end.
EpochPlan drawn_epoch(const EpochPlan& planned, const Behavior& b,
                      int64_t micro_batch, int64_t K,
                      int64_t micro_before_epoch, bool& unfinished);

// window-buffer-across-epochs: the epoch's drawn micro-batches after the
// ones `carry` holds (the earlier epochs' leftover, not yet run), cut into
// windows of K (the epoch's); what does not fill a last K is left in
// `carry` for the next epoch, unrun.  Every window is full.
// `carry_epochs` holds the epoch each carried micro-batch was drawn in;
// `drawn_in` is set to that of each micro-batch of the windows, in order.
EpochPlan buffered_epoch(const EpochPlan& drawn, int64_t K, int64_t epoch,
                         std::vector<MicroBatch>& carry,
                         std::vector<int64_t>& carry_epochs,
                         std::vector<int64_t>& drawn_in);

// window-sum-across-epochs: the epoch's drawn windows, `carry` (the
// earlier epochs' leftover, backwarded in no step; here not yet run)
// joined to its first full one; its partial last window (or every window
// of an epoch with no full one) left in `carry` for the next epoch.  In
// the run's last epoch (`last_epoch`) what is left is its last window,
// partial: backwarded, never stepped.  `carry_epochs` and `drawn_in` as
// buffered_epoch's.
inline EpochPlan joined_epoch(const EpochPlan& drawn, int64_t epoch,
                              bool last_epoch, std::vector<MicroBatch>& carry,
                              std::vector<int64_t>& carry_epochs,
                              std::vector<int64_t>& drawn_in) {
  EpochPlan e;
  e.accumulation = drawn.accumulation;
  drawn_in.clear();
  auto flush = [&](bool partial) {
    Window w;
    w.micro = std::move(carry);
    w.partial = partial;
    e.windows.push_back(std::move(w));
    drawn_in.insert(drawn_in.end(), carry_epochs.begin(), carry_epochs.end());
    carry.clear();
    carry_epochs.clear();
  };
  for (const Window& w : drawn.windows) {
    carry.insert(carry.end(), w.micro.begin(), w.micro.end());
    carry_epochs.insert(carry_epochs.end(), w.micro.size(), epoch);
    if (!w.partial) flush(false);
  }
  if (last_epoch && !carry.empty()) flush(true);
  return e;
}

}  // namespace accumcheck
