#include "sim/trainer_draw.hpp"

namespace accumcheck {

EpochPlan drawn_epoch(const EpochPlan& planned, const Behavior& b,
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

EpochPlan buffered_epoch(const EpochPlan& drawn, int64_t K, int64_t epoch,
                         std::vector<MicroBatch>& carry,
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

}  // namespace accumcheck
