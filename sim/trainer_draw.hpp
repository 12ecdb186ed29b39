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
inline EpochPlan drawn_epoch(const EpochPlan& planned, const Behavior& b,
                             int64_t micro_batch, int64_t K,
                             int64_t micro_before_epoch, bool& unfinished) {
  std::vector<MicroBatch> micro;
  int64_t samples = 0;  // the epoch's samples over all ranks
  for (const Window& w : planned.windows) {
    micro.insert(micro.end(), w.micro.begin(), w.micro.end());
    for (const MicroBatch& m : w.micro) samples += m.items();
  }
  if (b.skip_short_micro_batch && !micro.empty()) {
    bool is_short = false;
    for (const auto& shard : micro.back().shards)
      is_short = is_short || int64_t(shard.size()) < micro_batch;
    if (is_short) micro.pop_back();
  }
  // The loader's length (the epoch's end is its last micro-batch).
  const int64_t M = int64_t(micro.size());
  unfinished = false;
  if (b.last_fetch_in_samples && K > 0) {
    // Fetches of K, the last of r = N mod K (K when 0) micro-batches:
    // K * floor(M / K) + min(r, M mod K) drawn.
    const int64_t r = samples % K == 0 ? K : samples % K;
    const int64_t keep = M / K * K + std::min(r, M % K);
    unfinished = keep < M;
    micro.resize(size_t(keep));
  }
  EpochPlan e;
  e.accumulation = planned.accumulation;
  if (b.windows_across_epochs) {
    // window-counter-across-epochs: a step where the run's micro-batch
    // count (micro_before_epoch: earlier epochs') reaches a multiple of
    // K, or at the end of an epoch of M <= K (the loader's last
    // micro-batch: never, when it is not drawn); the rest of the epoch is
    // a partial window (leaked: neither stepped nor zeroed).
    const int64_t drawn_count = int64_t(micro.size());
    int64_t total = micro_before_epoch;
    Window w;
    for (int64_t i = 0; i < drawn_count; ++i) {
      w.micro.push_back(micro[size_t(i)]);
      if (++total % K == 0 || (M <= K && i + 1 == M)) {
        w.partial = false;
        e.windows.push_back(std::move(w));
        w = Window{};
      }
    }
    if (!w.micro.empty()) {
      w.partial = true;
      e.windows.push_back(std::move(w));
    }
    return e;
  }
  size_t at = 0;
  if (b.window_off_by_one && !micro.empty()) {
    e.windows.push_back(Window{{micro[0]}, false});  // i = 0: 0 % K == 0
    at = 1;
  }
  while (at < micro.size()) {
    Window w;
    const size_t end = std::min(micro.size(), at + size_t(K));
    w.micro.assign(micro.begin() + std::ptrdiff_t(at),
                   micro.begin() + std::ptrdiff_t(end));
    w.partial = int64_t(w.micro.size()) < K;
    e.windows.push_back(std::move(w));
    at = end;
  }
  return e;
}

// window-buffer-across-epochs: the epoch's drawn micro-batches after the
// ones `carry` holds (the earlier epochs' leftover, not yet run), cut into
// windows of K (the epoch's); what does not fill a last K is left in
// `carry` for the next epoch, unrun.  Every window is full.
// `carry_epochs` holds the epoch each carried micro-batch was drawn in;
// `drawn_in` is set to that of each micro-batch of the windows, in order.
inline EpochPlan buffered_epoch(const EpochPlan& drawn, int64_t K,
                                int64_t epoch, std::vector<MicroBatch>& carry,
                                std::vector<int64_t>& carry_epochs,
                                std::vector<int64_t>& drawn_in) {
  for (const Window& w : drawn.windows) {
    carry.insert(carry.end(), w.micro.begin(), w.micro.end());
    carry_epochs.insert(carry_epochs.end(), w.micro.size(), epoch);
  }
  EpochPlan e;
  e.accumulation = drawn.accumulation;
  const size_t k = size_t(std::max<int64_t>(K, 1));
  size_t at = 0;
  for (; carry.size() - at >= k; at += k) {
    Window w;
    w.micro.assign(carry.begin() + std::ptrdiff_t(at),
                   carry.begin() + std::ptrdiff_t(at + k));
    e.windows.push_back(std::move(w));
  }
  drawn_in.assign(carry_epochs.begin(),
                  carry_epochs.begin() + std::ptrdiff_t(at));
  carry.erase(carry.begin(), carry.begin() + std::ptrdiff_t(at));
  carry_epochs.erase(carry_epochs.begin(),
                     carry_epochs.begin() + std::ptrdiff_t(at));
  return e;
}

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
