#include "sim/plan.hpp"

#include <algorithm>
#include <numeric>

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

Plan make_plan(const Scenario& s) {
  const int64_t b = s.batching.micro_batch, K = s.batching.accumulation,
                R = s.batching.ranks;
  Plan plan;
  plan.accumulation = K;
  plan.ranks = R;
  for (int64_t e = 0; e < s.batching.epochs; ++e) {
    const std::vector<int64_t> order = epoch_order(s, e);
    const std::vector<std::vector<int64_t>> shard =
        rank_shards(order, R, s.batching.sampler);
    const int64_t per_rank = int64_t(shard[0].size());  // the longest
    const int64_t micro_steps = (per_rank + b - 1) / b;
    EpochPlan ep;
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
    plan.epochs.push_back(std::move(ep));
  }
  return plan;
}

Plan as_large_batch(const Plan& p) {
  Plan big;
  big.accumulation = 1;
  big.ranks = 1;
  for (const EpochPlan& e : p.epochs) {
    EpochPlan be;
    for (const Window& w : e.windows) {
      // One process: rank 0's samples of the window, then rank 1's, ...
      MicroBatch all;
      all.shards.resize(1);
      for (size_t r = 0; r < size_t(p.ranks); ++r)
        for (const MicroBatch& m : w.micro)
          all.shards[0].insert(all.shards[0].end(), m.shards[r].begin(),
                               m.shards[r].end());
      Window bw;
      bw.micro.push_back(std::move(all));
      be.windows.push_back(std::move(bw));
    }
    big.epochs.push_back(std::move(be));
  }
  return big;
}

}  // namespace accumcheck
