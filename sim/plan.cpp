#include "sim/plan.hpp"

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

Plan make_plan(const Scenario& s) {
  const int64_t b = s.batching.micro_batch, R = s.batching.ranks;
  Plan plan;
  plan.accumulation = accumulation_at(s.batching, 0);
  plan.ranks = R;
  for (int64_t e = 0; e < s.batching.epochs; ++e) {
    const int64_t K = accumulation_at(s.batching, e);
    const std::vector<int64_t> order = epoch_order(s, e);
    const int64_t n = int64_t(order.size());
    const int64_t per_rank = (n + R - 1) / R;  // DistributedSampler padding
    std::vector<std::vector<int64_t>> shard(static_cast<size_t>(R));
    for (int64_t i = 0; i < per_rank * R; ++i)
      shard[size_t(i % R)].push_back(order[size_t(i % n)]);
    const int64_t micro_steps = (per_rank + b - 1) / b;
    EpochPlan ep;
    ep.accumulation = K;
    for (int64_t m = 0; m < micro_steps; ++m) {
      if (m % K == 0) ep.windows.emplace_back();
      MicroBatch mb;
      for (int64_t r = 0; r < R; ++r) {
        const auto& sh = shard[size_t(r)];
        const int64_t lo = m * b, hi = std::min(per_rank, lo + b);
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
  big.ranks = p.ranks;
  for (const EpochPlan& e : p.epochs) {
    EpochPlan be;
    for (const Window& w : e.windows) {
      MicroBatch all;
      all.shards.resize(size_t(p.ranks));
      for (const MicroBatch& m : w.micro)
        for (size_t r = 0; r < m.shards.size(); ++r)
          all.shards[r].insert(all.shards[r].end(), m.shards[r].begin(),
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
