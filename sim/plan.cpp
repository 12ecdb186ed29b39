#include "sim/plan.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "sim/k_schedule.hpp"
#include "sim/rng.hpp"

namespace accumcheck {

std::vector<int64_t> epoch_order(const Scenario& s, int64_t epoch) {
  std::vector<int64_t> order(size_t(s.data.samples));
  std::iota(order.begin(), order.end(), 0);
  if (!s.data.shuffle) return order;
  // Fisher-Yates, each swap's randomness keyed by (seed, epoch, position).
  for (int64_t i = int64_t(order.size()) - 1; i > 0; --i) {
    const uint64_t bits =
        random_bits(s.data.seed, Stream::shuffle, uint64_t(epoch), uint64_t(i));
    std::swap(order[size_t(i)], order[uniform_index(bits, uint64_t(i) + 1)]);
  }
  return order;
}

std::vector<std::vector<int64_t>> rank_shards(const std::vector<int64_t>& order,
                                              int64_t R, Sampler sampler) {
  const int64_t n = int64_t(order.size());
  int64_t total = n;  // ids dealt out, position i to rank i % R
  if (sampler == Sampler::pad) total = (n + R - 1) / R * R;
  if (sampler == Sampler::drop_last) total = n / R * R;
  std::vector<std::vector<int64_t>> shard(static_cast<size_t>(R));
  for (int64_t i = 0; i < total; ++i)
    shard[size_t(i % R)].push_back(order[size_t(i % n)]);
  return shard;
}

namespace {

// The longest rank's shard (rank 0's) under the scenario's sampler.
int64_t longest_shard(const Scenario& s) {
  const int64_t n = s.data.samples, R = s.batching.ranks;
  return s.batching.sampler == Sampler::drop_last ? n / R : (n + R - 1) / R;
}

EpochPlan build_epoch(const Scenario& s, int64_t e) {
  const int64_t b = s.batching.micro_batch, R = s.batching.ranks;
  const int64_t K = accumulation_at(s.batching, e);  // K of this epoch
  const std::vector<int64_t> order = epoch_order(s, e);
  const std::vector<std::vector<int64_t>> shard =
      rank_shards(order, R, s.batching.sampler);
  const int64_t per_rank = int64_t(shard[0].size());  // the longest
  const int64_t micro_steps = (per_rank + b - 1) / b;
  EpochPlan ep;
  ep.accumulation = K;
  for (int64_t m = 0; m < micro_steps; ++m) {
    if (m % K == 0) ep.windows.emplace_back();
    MicroBatch mb;
    for (int64_t r = 0; r < R; ++r) {
      // A shorter shard (sampler = split) runs out first: its rank takes
      // part with an empty micro-batch, as under DDP's Join.
      const auto& sh = shard[size_t(r)];
      const int64_t n_r = int64_t(sh.size());
      const int64_t lo = std::min(n_r, m * b), hi = std::min(n_r, lo + b);
      mb.shards.emplace_back(sh.begin() + lo, sh.begin() + hi);
    }
    ep.windows.back().micro.push_back(std::move(mb));
  }
  for (Window& w : ep.windows) w.partial = int64_t(w.micro.size()) < K;
  return ep;
}

// One process: rank 0's samples of each window, then rank 1's, ...
EpochPlan large_batch_epoch(const EpochPlan& e, int64_t ranks) {
  EpochPlan be;
  for (const Window& w : e.windows) {
    MicroBatch all;
    all.shards.resize(1);
    for (size_t r = 0; r < size_t(ranks); ++r)
      for (const MicroBatch& m : w.micro)
        all.shards[0].insert(all.shards[0].end(), m.shards[r].begin(),
                             m.shards[r].end());
    Window bw;
    bw.micro.push_back(std::move(all));
    be.windows.push_back(std::move(bw));
  }
  return be;
}

}  // namespace

int64_t Plan::epoch_count() const {
  return lazy ? lazy->batching.epochs : int64_t(epochs.size());
}

EpochPlan Plan::epoch(int64_t e) const {
  if (!lazy) return epochs[size_t(e)];
  EpochPlan ep = build_epoch(*lazy, e);
  return large_batch ? large_batch_epoch(ep, lazy->batching.ranks) : ep;
}

int64_t Plan::windows() const {
  if (!lazy) {
    int64_t n = 0;
    for (const auto& e : epochs) n += int64_t(e.windows.size());
    return n;
  }
  const BatchingSpec& b = lazy->batching;
  const int64_t per_rank = longest_shard(*lazy);
  const int64_t micro = (per_rank + b.micro_batch - 1) / b.micro_batch;
  const int64_t per_epoch = (micro + b.accumulation - 1) / b.accumulation;
  int64_t n = 0;
  if (!b.accumulation_per_epoch.empty()) {
    // K per epoch: the listed epochs one by one (a ramp rule lists them
    // until K stops changing), then the last K for the rest.
    const int64_t listed =
        std::min<int64_t>(b.epochs, int64_t(b.accumulation_per_epoch.size()));
    for (int64_t e = 0; e < listed; ++e) {
      const int64_t K = b.accumulation_per_epoch[size_t(e)];
      n += (micro + K - 1) / K;
    }
    const int64_t K = b.accumulation_per_epoch.back();
    int64_t rest = 0;
    if (__builtin_mul_overflow((micro + K - 1) / K, b.epochs - listed, &rest) ||
        __builtin_add_overflow(n, rest, &n))
      return std::numeric_limits<int64_t>::max();
    return n;
  }
  if (__builtin_mul_overflow(per_epoch, b.epochs, &n))
    return std::numeric_limits<int64_t>::max();
  return n;
}

Plan make_plan(const Scenario& s) {
  Plan plan;
  plan.accumulation = accumulation_at(s.batching, 0);
  plan.ranks = s.batching.ranks;
  plan.lazy = std::make_shared<const Scenario>(s);
  return plan;
}

Plan materialize(const Plan& p) {
  if (!p.lazy) return p;
  Plan m;
  m.accumulation = p.accumulation;
  m.ranks = p.ranks;
  for (int64_t e = 0; e < p.epoch_count(); ++e) m.epochs.push_back(p.epoch(e));
  return m;
}

Plan as_large_batch(const Plan& p) {
  Plan big;
  big.accumulation = 1;
  big.ranks = 1;
  if (p.lazy) {
    big.lazy = p.lazy;
    big.large_batch = true;
    return big;
  }
  for (const EpochPlan& e : p.epochs)
    big.epochs.push_back(large_batch_epoch(e, p.ranks));
  return big;
}

}  // namespace accumcheck
