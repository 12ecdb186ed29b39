// Properties of the pitfalls that change how a loop draws and cuts its
// windows or when it steps its scheduler: window-boundary-off-by-one (and
// its max-steps form), window-counter-across-epochs,
// step-budget-drops-micro-batches, skip-short-micro-batch and the
// scheduler's order (DESIGN.md section 5).  The mistakes only a
// framework's loop makes are properties/framework_loop_properties.cpp.
// Each prediction is written from the pitfall's story (which
// micro-batches a step sums, which lr it uses), not by the trainer switch
// it checks.
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

// `for i, batch in enumerate(loader): loss / K; backward; if i % K == 0:
// step; zero_grad` -- each step sums the micro-batches since the last one,
// the previous epoch's leftovers included (nothing zeroes them), each
// weighted 1/(K*b_k).
void window_off_by_one() {
  const std::string name = "window.off-by-one";
  Triggers t = gradient_triggers({Pitfall::window_boundary_off_by_one});
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
  Triggers t =
      gradient_triggers({Pitfall::window_boundary_off_by_one_max_steps});
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

// Transformers' Trainer 4.45: `if total_batched_samples % K == 0` on a
// counter that runs across epochs.  A step sums the micro-batches since
// the last one: its own epoch's part (the micro-batches since the epoch
// began or since the last step) and the part the previous epoch left
// over, each part weighted 1/N over its own items (counted before its
// first backward); an epoch of M <= K micro-batches steps at its end.
void window_counter_across_epochs() {
  const std::string name = "window.counter-across-epochs";
  Triggers t = gradient_triggers({Pitfall::window_counter_across_epochs});
  t.partial_window = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::window_counter_across_epochs}, s.optimizer.lr);
  const Plan full = materialize(c.plan);  // epoch_micro points into it
  const std::vector<Micro> epochs = epoch_micro(full);
  // Per step: (parts, epoch of each part).
  std::vector<Groups> steps;
  Groups carry;
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
  check_step_parts(name, c, bug, steps, own_items, "window across epochs");
  record_case(name);
}

// Transformers' Trainer 4.45-4.51: max_steps = epochs x max(1, M // K)
// counted before training; the windows are correct's (each epoch's K,
// K, ..., the partial one, at 1/N_w) until the steps reach it.
void step_budget_drops_micro_batches() {
  const std::string name = "window.step-budget";
  Triggers t = gradient_triggers({Pitfall::step_budget_drops_micro_batches});
  t.partial_window = true;
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
  Triggers t = gradient_triggers({Pitfall::skip_short_micro_batch});
  t.short_micro = true;
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
  };
  return props;
}

}  // namespace accumcheck::properties
