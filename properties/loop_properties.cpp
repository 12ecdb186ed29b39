// Properties of the pitfalls that change how a loop draws and cuts its
// windows or when it steps its scheduler: window-boundary-off-by-one,
// skip-short-micro-batch, scheduler-before-optimizer, scheduler-per-epoch
// (DESIGN.md section 5), and the mistakes only a framework's loop makes:
// loss-divided-by-k-twice, end-of-loader-syncs-every-micro-batch,
// items-counted-per-fetch-group, last-fetch-sized-in-samples.  Each
// prediction is written from the pitfall's story (which micro-batches a step
// sums, which lr it uses), not by the trainer switch it checks.
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "sim/lr_schedule.hpp"

namespace accumcheck::properties {

namespace {

using Micro = std::vector<const MicroBatch*>;
// (micro-batches, epoch) per optimizer step.
using Groups = std::vector<std::pair<Micro, int64_t>>;

// Each epoch's micro-batches in order.
std::vector<Micro> epoch_micro(const Plan& p) {
  std::vector<Micro> out;
  for (const EpochPlan& e : p.epochs) {
    out.emplace_back();
    for (const Window& w : e.windows)
      for (const MicroBatch& m : w.micro) out.back().push_back(&m);
  }
  return out;
}

// The plan's windows, each with its epoch (pointing into `full`).
Groups plan_windows(const Plan& full) {
  Groups out;
  for (size_t e = 0; e < full.epochs.size(); ++e)
    for (const Window& w : full.epochs[e].windows) {
      Micro ms;
      for (const MicroBatch& m : w.micro) ms.push_back(&m);
      out.push_back({ms, int64_t(e)});
    }
  return out;
}

Parts weighted(const Micro& ms, const std::function<int64_t(int64_t)>& den) {
  Parts ps;
  for (const MicroBatch* m : ms)
    for (const auto& sh : m->shards)
      if (!sh.empty()) ps.push_back({sh, den(int64_t(sh.size()))});
  return ps;
}

int64_t ranks_of(const MicroBatch& m) { return int64_t(m.shards.size()); }

// Each step of `bug` sums exactly groups[i], each item of a shard of b
// items weighted 1/den(group, b), at the parameters before the step.
void check_groups(const std::string& name, const Case& c, const Run<R>& bug,
                  const Groups& groups,
                  const std::function<int64_t(const Micro&, int64_t b)>& den,
                  const char* what) {
  RC_ASSERT(bug.steps.size() == groups.size());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const Micro& g = groups[i].first;
    const auto want = predicted(
        c, theta_before(bug, i, c),
        weighted(g, [&](int64_t b) { return den(g, b); }), groups[i].second);
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(), what);
  }
}

// `for i, batch in enumerate(loader): loss / K; backward; if i % K == 0:
// step; zero_grad` -- each step sums the micro-batches since the last one,
// the previous epoch's leftovers included (nothing zeroes them), each
// weighted 1/(K*b_k).
void window_off_by_one() {
  const std::string name = "window.off-by-one";
  Triggers t;
  t.pitfalls = {Pitfall::window_boundary_off_by_one};
  t.no_clip = true;
  t.no_weight_decay = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::window_boundary_off_by_one}, s.optimizer.lr);
  Groups groups;
  Micro carry;
  const Plan full = materialize(c.plan);
  const std::vector<Micro> epochs = epoch_micro(full);
  for (size_t e = 0; e < epochs.size(); ++e)
    for (size_t i = 0; i < epochs[e].size(); ++i) {
      carry.push_back(epochs[e][i]);
      if (int64_t(i) % K == 0) {
        groups.push_back({carry, int64_t(e)});
        carry.clear();
      }
    }
  check_groups(
      name, c, bug, groups,
      [K](const Micro& g, int64_t b) { return K * b * ranks_of(*g.front()); },
      "shifted window");
  record_case(name);
}

// run_clm_no_trainer (2021): `loss / K; backward; if i % K == 0 or i ==
// len - 1: step; zero_grad` and `if completed_steps >= max_train_steps:
// break`, max_train_steps = epochs x ceil(len / K) -- each step sums the
// micro-batches since the last one, the epoch's rest stepped at its end,
// each weighted 1/(K*b_k); an epoch ends early once the steps reach
// max_train_steps.
void window_off_by_one_max_steps() {
  const std::string name = "window.off-by-one-max-steps";
  Triggers t;
  t.pitfalls = {Pitfall::window_boundary_off_by_one_max_steps};
  t.no_clip = true;
  t.no_weight_decay = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug = c.run(
      c.plan, {Pitfall::window_boundary_off_by_one_max_steps}, s.optimizer.lr);
  Groups groups;
  const Plan full = materialize(c.plan);
  const std::vector<Micro> epochs = epoch_micro(full);
  const int64_t max_steps =
      int64_t(epochs.size()) * ((int64_t(epochs[0].size()) + K - 1) / K);
  for (size_t e = 0; e < epochs.size(); ++e) {
    Micro carry;
    for (size_t i = 0; i < epochs[e].size(); ++i) {
      carry.push_back(epochs[e][i]);
      if (int64_t(i) % K == 0 || i + 1 == epochs[e].size()) {
        groups.push_back({carry, int64_t(e)});
        carry.clear();
        if (int64_t(groups.size()) >= max_steps) break;
      }
    }
  }
  RC_ASSERT(bug.steps.size() == groups.size());
  check_groups(
      name, c, bug, groups,
      [K](const Micro& g, int64_t b) { return K * b * ranks_of(*g.front()); },
      "shifted window");
  record_case(name);
}

// The summed item count of a list of micro-batches (every rank's shard).
int64_t items_of(const Micro& g) {
  int64_t N = 0;
  for (const MicroBatch* m : g) N += m->items();
  return N;
}

// Transformers' Trainer 4.45: `if total_batched_samples % K == 0` on a
// counter that runs across epochs.  A step sums the micro-batches since
// the last one: its own epoch's part (the micro-batches since the epoch
// began or since the last step) and the part the previous epoch left
// over, each part weighted 1/N over its own items (counted before its
// first backward); an epoch of M <= K micro-batches steps at its end.
void window_counter_across_epochs() {
  const std::string name = "window.counter-across-epochs";
  Triggers t;
  t.pitfalls = {Pitfall::window_counter_across_epochs};
  t.partial_window = true;
  t.no_clip = true;
  t.no_weight_decay = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::window_counter_across_epochs}, s.optimizer.lr);
  const Plan full = materialize(c.plan);  // epoch_micro points into it
  const std::vector<Micro> epochs = epoch_micro(full);
  // Per step: (parts, epoch of each part).
  using Step = std::vector<std::pair<Micro, int64_t>>;
  std::vector<Step> steps;
  Step carry;
  int64_t total = 0;
  for (size_t e = 0; e < epochs.size(); ++e) {
    const int64_t M = int64_t(epochs[e].size());
    Micro part;
    for (int64_t i = 0; i < M; ++i) {
      part.push_back(epochs[e][size_t(i)]);
      if (++total % K == 0 || (M <= K && i + 1 == M)) {
        carry.push_back({part, int64_t(e)});
        steps.push_back(carry);
        carry.clear();
        part.clear();
      }
    }
    if (!part.empty()) carry.push_back({part, int64_t(e)});
  }
  RC_ASSERT(bug.steps.size() == steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    std::vector<R> want;
    for (const auto& [part, e] : steps[i]) {
      const int64_t N = items_of(part);
      const std::vector<R> g =
          predicted(c, theta, weighted(part, [N](int64_t) { return N; }), e);
      if (want.empty()) want.assign(g.size(), R(0));
      for (size_t j = 0; j < g.size(); ++j) want[j] += g[j];
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "window across epochs");
  }
  record_case(name);
}

// Transformers' Trainer 4.45-4.51: max_steps = epochs x max(1, M // K)
// counted before training; the windows are correct's (each epoch's K,
// K, ..., the partial one, at 1/N_w) until the steps reach it.
void step_budget_drops_micro_batches() {
  const std::string name = "window.step-budget";
  Triggers t;
  t.pitfalls = {Pitfall::step_budget_drops_micro_batches};
  t.partial_window = true;
  t.no_clip = true;
  t.no_weight_decay = true;
  Scenario s = *scenario(t).as("scenario");
  // A linear or cosine schedule, its horizon the run's steps ("auto"), its
  // warmup in steps or as a ratio of the horizon (the gradients below are
  // read at the run's own parameters: the lr changes none of them).
  s.schedule = ScheduleSpec{};
  s.schedule.kind =
      *rc::gen::element(ScheduleKind::linear, ScheduleKind::cosine).as("kind");
  s.schedule.total_auto = true;
  const bool ratio = *rc::gen::arbitrary<bool>().as("warmup as a ratio");
  if (ratio)
    s.schedule.warmup_ratio = double(*rc::gen::inRange(0, 5)) / 8.0;
  else
    s.schedule.warmup = *rc::gen::inRange<int64_t>(0, 4);
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const double lr = s.optimizer.lr;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::step_budget_drops_micro_batches}, lr);
  const Plan full = materialize(c.plan);  // epoch_micro points into it
  const std::vector<Micro> epochs = epoch_micro(full);
  const int64_t budget = int64_t(epochs.size()) *
                         std::max<int64_t>(1, int64_t(epochs[0].size()) / K);
  // Correct's windows (the plan's), the first `budget` of them; correct
  // takes at least as many windows as the budget allows.
  Groups windows = plan_windows(full);
  RC_ASSERT(int64_t(windows.size()) >= budget);
  windows.resize(size_t(budget));
  check_groups(
      name, c, bug, windows,
      [](const Micro& g, int64_t) { return items_of(g); }, "budgeted window");
  // The same budget is the horizon of the scheduler the trainer builds
  // (num_training_steps = max_steps): get_{linear,cosine}_schedule_with_
  // warmup over `budget` steps, a warmup ratio taken of the budget,
  // written out here as Transformers writes them.
  const int64_t W =
      ratio ? int64_t(std::ceil(double(budget) * s.schedule.warmup_ratio))
            : s.schedule.warmup;
  const double span = double(std::max<int64_t>(1, budget - W));
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const int64_t n = int64_t(i);
    double S = double(n) / double(std::max<int64_t>(1, W));
    if (n >= W)
      S = s.schedule.kind == ScheduleKind::linear
              ? std::max(0.0, double(budget - n) / span)
              : std::max(0.0,
                         0.5 * (1.0 + std::cos(M_PI * (double(n - W) / span))));
    RC_ASSERT(bug.steps[i].lr == lr * S);
  }
  record_case(name);
}

// DataLoader(drop_last=True): each epoch's short last micro-batch never
// drawn; the rest cut into windows of K, each weighted 1/N_w over what
// it holds.
void skip_short_micro_batch() {
  const std::string name = "data.skip-short-micro-batch";
  Triggers t;
  t.pitfalls = {Pitfall::skip_short_micro_batch};
  t.short_micro = true;
  t.no_clip = true;
  t.no_weight_decay = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::skip_short_micro_batch}, s.optimizer.lr);
  Groups windows;
  const Plan full = materialize(c.plan);
  const std::vector<Micro> epochs = epoch_micro(full);
  int64_t skipped = 0;
  for (size_t e = 0; e < epochs.size(); ++e) {
    Micro ms = epochs[e];
    bool is_short = false;
    for (const auto& sh : ms.back()->shards)
      is_short = is_short || int64_t(sh.size()) < s.batching.micro_batch;
    if (is_short) {
      ms.pop_back();
      ++skipped;
    }
    for (size_t at = 0; at < ms.size(); at += size_t(K))
      windows.push_back({Micro(ms.begin() + std::ptrdiff_t(at),
                               ms.begin() + std::ptrdiff_t(std::min(
                                                ms.size(), at + size_t(K)))),
                         int64_t(e)});
  }
  RC_ASSERT(skipped == int64_t(epochs.size()));  // the trigger is present
  check_groups(
      name, c, bug, windows,
      [](const Micro& g, int64_t) {
        int64_t N = 0;
        for (const MicroBatch* m : g) N += m->items();
        return N;
      },
      "drawn window");
  record_case(name);
}

// Exact lr sequences: scheduler-before-optimizer uses S(t+1) at step t;
// scheduler-per-epoch uses S(e) at every step of epoch e; a frequency f
// counted in optimizer steps or (scheduler-frequency-in-micro-batches)
// in the epoch's micro-batches.
void scheduler_order() {
  const std::string name = "scheduler.order";
  Triggers t;
  t.schedule = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const double lr = s.optimizer.lr;
  const Run<R> ahead = c.run(c.plan, {Pitfall::scheduler_before_optimizer}, lr);
  RC_ASSERT(!ahead.steps.empty());
  for (size_t i = 0; i < ahead.steps.size(); ++i)
    RC_ASSERT(ahead.steps[i].lr ==
              lr * lr_multiplier(s.schedule, int64_t(i) + 1));
  const Run<R> per_epoch = c.run(c.plan, {Pitfall::scheduler_per_epoch}, lr);
  for (const auto& st : per_epoch.steps)
    RC_ASSERT(st.lr == lr * lr_multiplier(s.schedule, st.epoch));
  // scheduler-per-micro-step: a step after n micro-steps uses S(n - 1)
  // (its own micro-step's scheduler.step() follows it); with
  // scheduler-before-optimizer too (scheduler.step() right after each
  // backward), S(n).
  for (const bool first : {false, true}) {
    std::vector<Pitfall> sem = {Pitfall::scheduler_per_micro_step};
    if (first) sem.push_back(Pitfall::scheduler_before_optimizer);
    const Run<R> run = c.run(c.plan, sem, lr);
    int64_t micro = 0, steps = 0;
    for (const Event& ev : run.events) {
      if (ev.rank != 0) continue;
      if (ev.kind == EventKind::forward_backward) ++micro;
      if (ev.kind != EventKind::optimizer_step) continue;
      RC_ASSERT(ev.lr ==
                lr * lr_multiplier(s.schedule, micro - (first ? 0 : 1)));
      ++steps;
    }
    RC_ASSERT(steps > 0);
  }
  // A frequency f: correct steps the scheduler after every f-th
  // optimizer step (step i uses S(floor(i / f))); scheduler-frequency-
  // in-micro-batches after the steps whose window ends on the epoch's
  // micro-batch numbered a multiple of f.
  Scenario sf = s;
  sf.schedule.frequency = *rc::gen::inRange<int64_t>(1, 5);
  const Case cf(sf);
  const Run<R> every = cf.run(cf.plan, {}, lr);
  for (size_t i = 0; i < every.steps.size(); ++i)
    RC_ASSERT(
        every.steps[i].lr ==
        lr * lr_multiplier(sf.schedule, int64_t(i) / sf.schedule.frequency));
  const Run<R> micro =
      cf.run(cf.plan, {Pitfall::scheduler_frequency_in_micro_batches}, lr);
  int64_t in_epoch = 0, epoch = -1, calls = 0, steps = 0;
  for (const Event& ev : micro.events) {
    if (ev.rank != 0) continue;
    if (ev.kind == EventKind::forward_backward) {
      if (ev.epoch != epoch) epoch = ev.epoch, in_epoch = 0;
      ++in_epoch;
    }
    if (ev.kind != EventKind::optimizer_step) continue;
    RC_ASSERT(ev.lr == lr * lr_multiplier(sf.schedule, calls));
    if (in_epoch % sf.schedule.frequency == 0) ++calls;
    ++steps;
  }
  RC_ASSERT(steps > 0);
  record_case(name);
}

// ---------------------------- mistakes only a framework's loop makes

// The user's `loss / K` (or a loop already normalized) divided by K again
// by the framework: each step sums its window, every item weighted
// 1/(K*N_w) (the window's items, a partial window's too); with
// partial-cycle-scale-by-k the partial window's items weigh 1/(K*K*b_k*R)
// (the framework's / K of `loss / K` on the rank's micro-batch, then
// DDP's average).
void loss_divided_by_k_twice() {
  const std::string name = "framework.loss-divided-by-k-twice";
  Triggers t;
  t.pitfalls = {Pitfall::loss_divided_by_k_twice};
  t.partial_window = *rc::gen::arbitrary<bool>();
  t.max_ranks = 2;
  t.no_clip = true;
  t.no_weight_decay = true;
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
  Triggers t;
  t.pitfalls = {Pitfall::end_of_loader_syncs_every_micro_batch};
  t.partial_window = *rc::gen::arbitrary<bool>();
  t.max_ranks = 2;
  t.no_clip = true;
  t.no_weight_decay = true;
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
  Triggers t;
  t.pitfalls = {across, fetch};
  t.partial_window = true;
  t.max_ranks = 2;
  t.no_clip = true;
  t.no_weight_decay = true;
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
  Triggers t;
  t.pitfalls = {Pitfall::last_fetch_sized_in_samples};
  t.no_clip = true;
  t.no_weight_decay = true;
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
  std::vector<std::vector<std::pair<Micro, int64_t>>> steps;
  std::vector<std::pair<Micro, int64_t>> carry;
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
  RC_ASSERT(bug.steps.size() == steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    std::vector<R> want;
    for (const auto& [part, e] : steps[i]) {
      const int64_t N = items_of(part);
      const std::vector<R> g =
          predicted(c, theta, weighted(part, [N](int64_t) { return N; }), e);
      if (want.empty()) want.assign(g.size(), R(0));
      for (size_t j = 0; j < g.size(); ++j) want[j] += g[j];
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "window of the drawn micro-batches");
  }
  record_case(name);
}

// The scenario of a window pitfall that crosses an epoch's end: partial
// windows, no clip or weight decay (each step's gradient is then the sum
// of its parts'), two epochs or three (a leftover that joins the next).
Scenario across_epochs_scenario(Pitfall p) {
  Triggers t;
  t.pitfalls = {p};
  t.partial_window = true;
  t.no_clip = true;
  t.no_weight_decay = true;
  Scenario s = *scenario(t).as("scenario");
  s.batching.epochs = *rc::gen::inRange<int64_t>(2, 4).as("epochs");
  return s;
}

// Each of `bug`'s steps sums its parts' gradients, every item weighted 1/N
// over the whole window's items (all its parts, whichever epoch each was
// drawn in), each part predicted with its own epoch.
void assert_windows_counted_whole(const std::string& name, const Case& c,
                                  const Run<R>& bug,
                                  const std::vector<Groups>& steps,
                                  const char* what) {
  RC_ASSERT(bug.steps.size() == steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    int64_t N = 0;
    for (const auto& [part, e] : steps[i]) N += items_of(part);
    const std::vector<R> theta = theta_before(bug, i, c);
    std::vector<R> want;
    for (const auto& [part, e] : steps[i]) {
      const std::vector<R> g =
          predicted(c, theta, weighted(part, [N](int64_t) { return N; }), e);
      if (want.empty()) want.assign(g.size(), R(0));
      for (size_t j = 0; j < g.size(); ++j) want[j] += g[j];
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(), what);
  }
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
  assert_windows_counted_whole(name, c, bug, steps,
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
  assert_windows_counted_whole(
      name, c, bug, steps,
      "leftover joined to the next epoch's first window, counted whole");
  record_case(name);
}

}  // namespace

const std::vector<Property>& loop_properties() {
  static const std::vector<Property> props = {
      {"window.off-by-one", "oracle",
       "window-boundary-off-by-one: each step sums the micro-batches since "
       "the last `i % K == 0`, leftovers of the previous epoch included, "
       "each weighted 1/(K*b_k)",
       window_off_by_one},
      {"window.off-by-one-max-steps", "oracle",
       "window-boundary-off-by-one-max-steps: each step sums the micro-batches "
       "since the last `i % K == 0`, the epoch's rest stepped at its end, each "
       "weighted 1/(K*b_k); an epoch ends once the steps reach epochs x "
       "ceil(micro-batches / K)",
       window_off_by_one_max_steps},
      {"window.counter-across-epochs", "oracle",
       "window-counter-across-epochs: a step where the run's micro-batch "
       "count reaches a multiple of K, an epoch's leftover (weighted 1/N "
       "over its own items) joining the next epoch's first part",
       window_counter_across_epochs},
      {"window.step-budget", "oracle",
       "step-budget-drops-micro-batches: correct's windows until the steps "
       "reach epochs x max(1, floor(M / K)); nothing after; a linear or "
       "cosine schedule's horizon is that budget",
       step_budget_drops_micro_batches},
      {"data.skip-short-micro-batch", "oracle",
       "skip-short-micro-batch: the short last micro-batch of every epoch "
       "never contributes; the rest is windowed by K at 1/N_w",
       skip_short_micro_batch},
      {"scheduler.order", "oracle",
       "scheduler-before-optimizer uses S(t+1) at step t; "
       "scheduler-per-epoch uses S(epoch); scheduler-per-micro-step uses "
       "S(n-1) after n micro-steps, S(n) with scheduler-before-optimizer",
       scheduler_order},
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
