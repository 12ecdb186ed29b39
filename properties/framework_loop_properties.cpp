// Properties of the mistakes only a framework's loop makes:
// loss-divided-by-k-twice, end-of-loader-syncs-every-micro-batch,
// items-counted-per-fetch-group, last-fetch-sized-in-samples, and the
// windows carried across an epoch's end (window-buffer-across-epochs,
// window-sum-across-epochs).  The loop's own window cutters are
// properties/loop_properties.cpp.  Each prediction is written from the
// pitfall's story (which micro-batches a step sums, with which weights),
// not by the trainer switch it checks.
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "properties/loop_groups.hpp"
#include "properties/windows.hpp"
#include "sim/lr_schedule.hpp"

namespace accumcheck::properties {

namespace {

// The user's `loss / K` (or a loop already normalized) divided by K again
// by the framework: each step sums its window, every item weighted
// 1/(K*N_w) (the window's items, a partial window's too); with
// partial-cycle-scale-by-k the partial window's items weigh 1/(K*K*b_k*R)
// (the framework's / K of `loss / K` on the rank's micro-batch, then
// DDP's average).
void loss_divided_by_k_twice() {
  const std::string name = "framework.loss-divided-by-k-twice";
  Triggers t = gradient_triggers({Pitfall::loss_divided_by_k_twice});
  t.partial_window = *rc::gen::arbitrary<bool>();
  t.max_ranks = 2;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Plan full = materialize(c.plan);  // the groups point into it
  const Groups windows = plan_windows(full);
  const Run<R> twice =
      c.run(c.plan, {Pitfall::loss_divided_by_k_twice}, s.optimizer.lr);
  check_groups(
      name, c, twice, windows,
      [K](const Micro& g, int64_t) { return K * items_of(g); }, "window / K");
  const Run<R> with_partial = c.run(
      c.plan,
      {Pitfall::partial_cycle_scale_by_k, Pitfall::loss_divided_by_k_twice},
      s.optimizer.lr);
  check_groups(
      name, c, with_partial, windows,
      [K](const Micro& g, int64_t b) {
        const bool partial = int64_t(g.size()) < K;
        return partial ? K * K * b * ranks_of(*g.front()) : K * items_of(g);
      },
      "window / K, partial window / K^2 per micro-batch");
  record_case(name);
}

// Accelerate's accumulate() at the end of the loader, in a loop that
// draws its window first: each epoch's last window steps after every
// micro-batch, each alone with its weight in the window (1/N_w of the
// whole window); every other window as correct.
void end_of_loader() {
  const std::string name = "framework.end-of-loader";
  Triggers t =
      gradient_triggers({Pitfall::end_of_loader_syncs_every_micro_batch});
  t.partial_window = *rc::gen::arbitrary<bool>();
  t.max_ranks = 2;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Plan full = materialize(c.plan);
  Groups steps;
  std::vector<int64_t> window_items;  // per step: its window's N_w
  for (size_t e = 0; e < full.epochs.size(); ++e) {
    const auto& ws = full.epochs[e].windows;
    for (size_t i = 0; i < ws.size(); ++i) {
      Micro ms;
      for (const MicroBatch& m : ws[i].micro) ms.push_back(&m);
      const int64_t n = items_of(ms);
      if (i + 1 < ws.size()) {
        steps.push_back({ms, int64_t(e)});
        window_items.push_back(n);
        continue;
      }
      for (const MicroBatch* m : ms) {
        steps.push_back({Micro{m}, int64_t(e)});
        window_items.push_back(n);
      }
    }
  }
  const Run<R> bug = c.run(
      c.plan, {Pitfall::end_of_loader_syncs_every_micro_batch}, s.optimizer.lr);
  RC_ASSERT(bug.steps.size() == steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto want = predicted(
        c, theta_before(bug, i, c),
        weighted(steps[i].first, [&](int64_t) { return window_items[i]; }),
        steps[i].second);
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "micro-batch of the last window alone");
  }
  record_case(name);
}

// ------------------- Transformers' Trainer 4.46-4.51's fetches (issue 33)

// Every micro-batch's fetch item count: each epoch's micro-batches in
// fetches of K from its start (the last one the epoch's rest), all ranks'
// items, and rank r's own.
struct FetchCounts {
  std::map<const MicroBatch*, int64_t> all;
  std::map<const MicroBatch*, std::vector<int64_t>> rank;
};
FetchCounts fetch_counts(const std::vector<Micro>& epochs, int64_t K) {
  FetchCounts out;
  for (const Micro& ms : epochs)
    for (size_t at = 0; at < ms.size(); at += size_t(K)) {
      const Micro f(
          ms.begin() + std::ptrdiff_t(at),
          ms.begin() + std::ptrdiff_t(std::min(ms.size(), at + size_t(K))));
      std::vector<int64_t> per(f.front()->shards.size(), 0);
      for (const MicroBatch* m : f)
        for (size_t r = 0; r < m->shards.size(); ++r)
          per[r] += int64_t(m->shards[r].size());
      for (const MicroBatch* m : f) {
        out.all[m] = items_of(f);
        out.rank[m] = per;
      }
    }
  return out;
}

// items-counted-per-fetch-group: alone (steps are fetches) it is correct,
// bit for bit; with window-counter-across-epochs a step sums the
// micro-batches since the last one (as window.counter-across-epochs cuts
// them), each item weighted 1/N over its micro-batch's fetch (every
// rank's items), and with ddp-uneven-shards too (each rank divides by its
// own fetch count, DDP averages) 1/(R*N_r).
void items_per_fetch_group() {
  const std::string name = "window.items-per-fetch-group";
  const Pitfall across = Pitfall::window_counter_across_epochs;
  const Pitfall fetch = Pitfall::items_counted_per_fetch_group;
  Triggers t = gradient_triggers({across, fetch});
  t.partial_window = true;
  t.max_ranks = 2;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const double lr = s.optimizer.lr;
  const Run<R> alone = c.run(c.plan, {fetch}, lr);
  const Run<R> correct = c.run(c.plan, {}, lr);
  RC_ASSERT(alone.steps.size() == correct.steps.size());
  for (size_t i = 0; i < alone.steps.size(); ++i)
    RC_ASSERT(alone.steps[i].grad == correct.steps[i].grad);

  const Plan full = materialize(c.plan);  // epoch_micro points into it
  const std::vector<Micro> epochs = epoch_micro(full);
  const FetchCounts n = fetch_counts(epochs, K);
  // The steps as the counter across epochs cuts them.
  std::vector<std::pair<Micro, int64_t>> parts;  // (micro-batches, epoch)
  std::vector<std::vector<std::pair<Micro, int64_t>>> steps;
  int64_t total = 0;
  for (size_t e = 0; e < epochs.size(); ++e) {
    const int64_t M = int64_t(epochs[e].size());
    Micro part;
    for (int64_t i = 0; i < M; ++i) {
      part.push_back(epochs[e][size_t(i)]);
      if (++total % K == 0 || (M <= K && i + 1 == M)) {
        parts.push_back({part, int64_t(e)});
        steps.push_back(parts);
        parts.clear();
        part.clear();
      }
    }
    if (!part.empty()) parts.push_back({part, int64_t(e)});
  }
  const int64_t Rk = s.batching.ranks;
  for (const bool per_rank : {false, true}) {
    std::vector<Pitfall> sem = {across, fetch};
    if (per_rank) sem.push_back(Pitfall::ddp_uneven_shards);
    const Run<R> bug = c.run(c.plan, sem, lr);
    RC_ASSERT(bug.steps.size() == steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::vector<R> theta = theta_before(bug, i, c);
      std::vector<R> want;
      for (const auto& [part, e] : steps[i]) {
        Parts ps;
        for (const MicroBatch* m : part)
          for (size_t r = 0; r < m->shards.size(); ++r)
            if (!m->shards[r].empty())
              ps.push_back({m->shards[r],
                            per_rank ? Rk * n.rank.at(m)[r] : n.all.at(m)});
        const std::vector<R> g = predicted(c, theta, ps, e);
        if (want.empty()) want.assign(g.size(), R(0));
        for (size_t j = 0; j < g.size(); ++j) want[j] += g[j];
      }
      assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                   per_rank ? "per fetch, each rank's own count"
                            : "per fetch across epochs");
    }
  }
  record_case(name);
}

// last-fetch-sized-in-samples: each epoch draws K*floor(M/K) + min(N mod
// K, M mod K) micro-batches (N its samples over all ranks, N mod K = 0
// read as K), in windows of K; when that is fewer than M its last window
// is not stepped: it joins the next window (the next epoch's first), each
// part at 1/N over its own items; the run's last one is never stepped.
// The shape is drawn so that the last fetch falls short: K >= 3, M mod K
// = r >= 2, b >= K (b consecutive sample counts hold every residue), N
// with 1 <= N mod K < r, over R = 1 or 2 ranks of N / R samples each.
void last_fetch_in_samples() {
  const std::string name = "window.last-fetch-in-samples";
  Triggers t = gradient_triggers({Pitfall::last_fetch_sized_in_samples});
  Scenario s = *scenario(t).as("scenario");
  const int64_t K = *rc::gen::inRange<int64_t>(3, 6).as("K");
  const int64_t r = *rc::gen::inRange<int64_t>(2, K).as("M mod K");
  const int64_t M = *rc::gen::inRange<int64_t>(0, 3).as("full fetches") * K + r;
  const int64_t b = *rc::gen::inRange<int64_t>(K, K + 3).as("b");
  const int64_t ranks = *rc::gen::inRange<int64_t>(1, 3).as("ranks");
  // Each rank's samples n in [(M - 1) b + 1, M b] (M micro-batches of b,
  // the last one 1..b), N = ranks x n short of a full last fetch.
  std::vector<int64_t> fits;
  for (int64_t n = (M - 1) * b + 1; n <= M * b; ++n)
    if ((ranks * n) % K >= 1 && (ranks * n) % K < r) fits.push_back(n);
  RC_PRE(!fits.empty());  // R = 2 with an even K holds even residues only
  s.batching.accumulation = K;
  s.batching.micro_batch = b;
  s.batching.ranks = ranks;
  s.batching.sampler = Sampler::pad;
  s.data.samples = ranks * *rc::gen::elementOf(fits).as("samples per rank");
  const Case c(s);
  const Plan full = materialize(c.plan);
  const std::vector<Micro> epochs = epoch_micro(full);
  std::vector<Groups> steps;
  Groups carry;
  int64_t undrawn = 0;
  for (size_t e = 0; e < epochs.size(); ++e) {
    const int64_t Me = int64_t(epochs[e].size());
    int64_t N = 0;
    for (const MicroBatch* m : epochs[e]) N += m->items();
    const int64_t last = N % K == 0 ? K : N % K;
    const int64_t keep = Me / K * K + std::min(last, Me % K);
    undrawn += Me - keep;
    for (int64_t at = 0; at < keep; at += K) {
      const int64_t end = std::min(keep, at + K);
      carry.push_back(
          {Micro(epochs[e].begin() + at, epochs[e].begin() + end), int64_t(e)});
      if (end - at == K || end == Me) {  // else cut short: carried
        steps.push_back(carry);
        carry.clear();
      }
    }
  }
  RC_ASSERT(undrawn > 0);  // the trigger is present
  const Run<R> bug =
      c.run(c.plan, {Pitfall::last_fetch_sized_in_samples}, s.optimizer.lr);
  check_step_parts(name, c, bug, steps, own_items,
                   "window of the drawn micro-batches");
  record_case(name);
}

// The scenario of a window pitfall that crosses an epoch's end: partial
// windows, no clip or weight decay (each step's gradient is then the sum
// of its parts'), two epochs or three (a leftover that joins the next).
Scenario across_epochs_scenario(Pitfall p) {
  Triggers t = gradient_triggers({p});
  t.partial_window = true;
  Scenario s = *scenario(t).as("scenario");
  s.batching.epochs = *rc::gen::inRange<int64_t>(2, 4).as("epochs");
  return s;
}

// A window buffer not reset at the epoch's end: `pending.append(batch);
// if len(pending) == K: N = items(pending); backward each / N; step;
// pending = []`.  The run's micro-batches cut in K from the run's start;
// a step sums its K micro-batches, each item weighted 1/N over the whole
// window's items (both epochs' parts, counted before its first backward),
// each part with the epoch it was drawn in; the run's last leftover in no
// step.
void window_buffer_across_epochs() {
  const std::string name = "window.buffer-across-epochs";
  const Scenario s =
      across_epochs_scenario(Pitfall::window_buffer_across_epochs);
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Plan full = materialize(c.plan);  // epoch_micro points into it
  const std::vector<Micro> epochs = epoch_micro(full);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::window_buffer_across_epochs}, s.optimizer.lr);
  // Per step: (parts, epoch each part was drawn in).
  std::vector<Groups> steps;
  Groups pending;
  int64_t held = 0;
  for (size_t e = 0; e < epochs.size(); ++e) {
    for (const MicroBatch* m : epochs[e]) {
      if (pending.empty() || pending.back().second != int64_t(e))
        pending.push_back({{}, int64_t(e)});
      pending.back().first.push_back(m);
      if (++held == K) {
        steps.push_back(pending);
        pending.clear();
        held = 0;
      }
    }
  }
  check_step_parts(name, c, bug, steps, step_items,
                   "window joined across epochs, counted whole");
  record_case(name);
}

// A running gradient sum and item count not reset at the epoch's end
// (torchtune's recipes): `n += items(b); (mean(b) * items(b)).backward();
// if (idx + 1) % K == 0: scale_grads(1 / n); step; zero; n = 0` on the
// epoch's own index.  Each epoch cut in K from its start; an epoch's
// leftover joins the next epoch's first full window (K + r micro-batches,
// each item at 1/N over all of them, each part with the epoch it was
// drawn in); the run's last leftover in no step.
void window_sum_across_epochs() {
  const std::string name = "window.sum-across-epochs";
  const Scenario s = across_epochs_scenario(Pitfall::window_sum_across_epochs);
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Plan full = materialize(c.plan);  // epoch_micro points into it
  const std::vector<Micro> epochs = epoch_micro(full);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::window_sum_across_epochs}, s.optimizer.lr);
  // Per step: (parts, epoch each part was drawn in).
  std::vector<Groups> steps;
  Groups pending;
  for (size_t e = 0; e < epochs.size(); ++e) {
    const Micro& ms = epochs[e];
    for (size_t at = 0; at < ms.size(); at += size_t(K)) {
      const size_t end = std::min(ms.size(), at + size_t(K));
      pending.push_back({Micro(ms.begin() + std::ptrdiff_t(at),
                               ms.begin() + std::ptrdiff_t(end)),
                         int64_t(e)});
      if (end - at == size_t(K)) {
        steps.push_back(pending);
        pending.clear();
      }
    }
  }
  check_step_parts(
      name, c, bug, steps, step_items,
      "leftover joined to the next epoch's first window, counted whole");
  record_case(name);
}

}  // namespace

const std::vector<Property>& framework_loop_properties() {
  static const std::vector<Property> props = {
      {"framework.loss-divided-by-k-twice", "oracle",
       "loss-divided-by-k-twice: each step sums its window at 1/(K*N_w); "
       "with partial-cycle-scale-by-k a partial window's items weigh "
       "1/(K^2*b_k)",
       loss_divided_by_k_twice},
      {"framework.end-of-loader", "oracle",
       "end-of-loader-syncs-every-micro-batch: each epoch's last window "
       "steps after every micro-batch, each alone at 1/N_w of its window; "
       "the other windows as correct",
       end_of_loader},
      {"window.items-per-fetch-group", "oracle",
       "items-counted-per-fetch-group: alone, correct bit for bit; with "
       "window-counter-across-epochs each step's micro-batches weigh 1/N "
       "over their fetch (K from the epoch's start), 1/(R*N_r) with "
       "ddp-uneven-shards",
       items_per_fetch_group},
      {"window.last-fetch-in-samples", "oracle",
       "last-fetch-sized-in-samples: K*floor(M/K) + min(N mod K, M mod K) "
       "micro-batches drawn per epoch; a last window cut short joins the "
       "next window, each part at 1/N over its items",
       last_fetch_in_samples},
      {"window.buffer-across-epochs", "oracle",
       "window-buffer-across-epochs: the run's micro-batches cut in K from "
       "its start, an epoch's leftover joining the next epoch's first "
       "micro-batches; each step at 1/N over its whole window's items; the "
       "run's last leftover in no step",
       window_buffer_across_epochs},
      {"window.sum-across-epochs", "oracle",
       "window-sum-across-epochs: each epoch cut in K from its start, an "
       "epoch's leftover joining the next epoch's first full window; each "
       "step at 1/N over its whole window's items; the run's last leftover "
       "in no step",
       window_sum_across_epochs},
  };
  return props;
}

}  // namespace accumcheck::properties
