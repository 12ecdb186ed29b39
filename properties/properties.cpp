// The property battery (DESIGN.md section 6), oracle tier: every claim is
// exact in real arithmetic, so runs are compared with oracle_tolerance().
// Predictions are computed here from DESIGN.md's formulas (per-sample
// weights, teacher-forced at the buggy run's own parameters), never by
// re-running the trainer's switch they check.
#include <rapidcheck.h>

#include <cmath>
#include <functional>

#include "properties/device_properties.hpp"
#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "properties/windows.hpp"
#include "sim/lr_schedule.hpp"

namespace accumcheck::properties {

namespace {

std::vector<R> add(const std::vector<R>& a, const std::vector<R>& b) {
  std::vector<R> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] + b[i];
  return d;
}

std::vector<R> sub(const std::vector<R>& a, const std::vector<R>& b) {
  std::vector<R> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// ---------------------------------------------------------------------------
// (a) Equivalence: correct accumulation == the large batch.

void equivalence_oracle() {
  const std::string name = "equivalence.oracle";
  Triggers t;
  t.max_ranks = 3;  // DDP with R ranks against one process's large batch
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  EngineState<R> ref_state, acc_state;
  const Run<R> ref =
      c.run(as_large_batch(c.plan), {}, s.optimizer.lr, &ref_state);
  const Run<R> acc = c.run(c.plan, {}, s.optimizer.lr, &acc_state);
  RC_ASSERT(!acc.steps.empty());
  RC_ASSERT(acc.steps.size() == ref.steps.size());
  RC_ASSERT(acc_state.optimizer_steps == ref_state.optimizer_steps);
  for (size_t t = 0; t < acc.steps.size(); ++t) {
    assert_close(name, acc.steps[t].grad, ref.steps[t].grad, oracle_tolerance(),
                 "gradient");
    assert_close(name, acc.steps[t].param, ref.steps[t].param,
                 oracle_tolerance(), "parameters");
  }
  if (!ref_state.exp_avg.empty())
    assert_close(name, acc_state.exp_avg, ref_state.exp_avg, oracle_tolerance(),
                 "exp_avg");
  if (!ref_state.exp_avg_sq.empty())
    assert_close(name, acc_state.exp_avg_sq, ref_state.exp_avg_sq,
                 oracle_tolerance(), "exp_avg_sq");
  record_case(name);
}

// ---------------------------------------------------------------------------
// (b) Loss normalization.

void no_loss_normalization_weights() {
  const std::string name = "loss-normalization.no-loss-normalization";
  const Scenario s =
      *scenario(gradient_triggers({Pitfall::no_loss_normalization}))
           .as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::no_loss_normalization}, s.optimizer.lr);
  check_weights(name, c, bug, [](const FlatWindow& fw) {
    const int64_t R_ = ranks(*fw.w);
    return all_parts(*fw.w, [R_](int64_t b) { return b * R_; });
  });
  record_case(name);
}

void no_loss_normalization_is_k_times() {
  // Equal micro-batches, full windows: G = K * g, and with plain SGD the
  // whole trajectory is `correct`'s at K*lr.
  const std::string name = "loss-normalization.sgd-at-k-lr";
  Triggers t = gradient_triggers({Pitfall::no_loss_normalization});
  t.full_windows = true;
  t.sgd_plain = true;
  // K a power of two: (K*lr)*S(t) and lr*S(t) then round alike in the
  // double the schedule is computed in, so the equality is exact.
  t.k_power_of_two = true;
  Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const double K = double(s.batching.accumulation);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::no_loss_normalization}, s.optimizer.lr);
  const Run<R> fast = c.run(c.plan, {}, s.optimizer.lr * K);
  RC_ASSERT(bug.windows.size() == fast.windows.size());
  for (size_t w = 0; w < bug.windows.size(); ++w)
    assert_close(name, bug.windows[w].param, fast.windows[w].param,
                 oracle_tolerance(), "parameters vs correct at K*lr");
  record_case(name);
}

void no_loss_normalization_adam_eps() {
  // Adam is invariant to the gradient's scale except through eps:
  // m/(sqrt v + eps) with (K m, K^2 v) is m/(sqrt v + eps/K).
  const std::string name = "loss-normalization.adam-eps-over-k";
  Triggers t = gradient_triggers({Pitfall::no_loss_normalization});
  t.full_windows = true;
  t.adam = true;
  Scenario s = *scenario(t).as("scenario");
  // eps = K * 2^-26 so that eps/K is exact in the double the oracle takes.
  s.optimizer.eps = double(s.batching.accumulation) * std::ldexp(1.0, -26);
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::no_loss_normalization}, s.optimizer.lr);
  Scenario s2 = s;
  s2.optimizer.eps = std::ldexp(1.0, -26);
  const Case c2(s2);
  const Run<R> eps = c2.run(c2.plan, {}, s.optimizer.lr);
  for (size_t w = 0; w < bug.windows.size(); ++w)
    assert_close(name, bug.windows[w].param, eps.windows[w].param,
                 oracle_tolerance(), "parameters vs correct with eps/K");
  record_case(name);
}

void sample_mean_of_means_weights() {
  const std::string name = "loss-normalization.sample-mean-of-means";
  Triggers t = gradient_triggers({Pitfall::sample_mean_of_means});
  t.short_micro = true;  // unequal micro-batch sizes
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::sample_mean_of_means}, s.optimizer.lr);
  check_weights(name, c, bug, [](const FlatWindow& fw) {
    const int64_t Kw = int64_t(fw.w->micro.size()), R_ = ranks(*fw.w);
    return all_parts(*fw.w, [=](int64_t b) { return Kw * b * R_; });
  });
  record_case(name);
}

// summed-loss-divided-by-k: every item's loss summed, the micro-batch /K:
// each item weighs 1/K (and DDP's average over R ranks 1/(K*R)), whatever
// its micro-batch and window hold.  Micro-batches of b >= 2 items keep
// N_w > K in every full window, so 1/N_w (correct) fails this.
void summed_loss_divided_by_k_weights() {
  const std::string name = "loss-normalization.summed-loss-divided-by-k";
  Triggers t = gradient_triggers({Pitfall::summed_loss_divided_by_k});
  t.short_micro = true;  // b >= 2, and a short last micro-batch
  t.max_ranks = 2;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::summed_loss_divided_by_k}, s.optimizer.lr);
  check_weights(name, c, bug, [&](const FlatWindow& fw) {
    const int64_t K = c.plan.epochs[size_t(fw.epoch)].accumulation;
    const int64_t R_ = ranks(*fw.w);
    return all_parts(*fw.w, [=](int64_t) { return K * R_; });
  });
  record_case(name);
}

// ---------------------------------------------------------------------------
// (c) zero_grad timing.

void zero_grad_every_micro_step() {
  const std::string name = "zero-grad.every-micro-step";
  const Scenario s =
      *scenario(gradient_triggers({Pitfall::zero_grad_every_micro_step}))
           .as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::zero_grad_every_micro_step}, s.optimizer.lr);
  // G = (1/N_w) * sum over the window's last micro-batch.
  check_weights(name, c, bug, [](const FlatWindow& fw) {
    const int64_t N = fw.w->items();
    const size_t last = fw.w->micro.size() - 1;
    return parts(*fw.w, last, last + 1, [N](int64_t) { return N; });
  });
  record_case(name);
}

void seed_002_loop() {
  const std::string name = "zero-grad.seed-002-loop";
  const Scenario s =
      *scenario(gradient_triggers({Pitfall::seed_002_loop})).as("scenario");
  const Case c(s);
  const Run<R> bug = c.run(c.plan, {Pitfall::seed_002_loop}, s.optimizer.lr);
  // One step per epoch iff K divides the epoch's micro-step count.
  int64_t expected_steps = 0;
  for (const auto& e : c.plan.epochs)
    expected_steps += e.micro_steps() % s.batching.accumulation == 0;
  RC_ASSERT(int64_t(bug.steps.size()) == expected_steps);
  const int64_t K = s.batching.accumulation;
  for (const auto& st : bug.steps) {
    const auto fws = flatten(c.plan);
    RC_ASSERT(fws[size_t(st.window)].last_of_epoch);
  }
  if (expected_steps == 0) {
    RC_TAG("never steps");
    record_case(name);
    return;
  }
  // G = the last micro-batch's mean / K.
  check_weights(name, c, bug, [K](const FlatWindow& fw) {
    const size_t last = fw.w->micro.size() - 1;
    const int64_t R_ = ranks(*fw.w);
    return parts(*fw.w, last, last + 1, [=](int64_t b) { return K * b * R_; });
  });
  record_case(name);
}

void zero_grad_never() {
  const std::string name = "zero-grad.never";
  const Scenario s =
      *scenario(gradient_triggers({Pitfall::zero_grad_never})).as("scenario");
  const Case c(s);
  const Run<R> bug = c.run(c.plan, {Pitfall::zero_grad_never}, s.optimizer.lr);
  const auto windows = flatten(c.plan);
  RC_ASSERT(!bug.steps.empty());
  // G_t - G_{t-1} = g_t at theta_t: the correct window gradient.
  for (size_t t = 0; t < bug.steps.size(); ++t) {
    const FlatWindow& fw = windows[size_t(bug.steps[t].window)];
    const int64_t N = fw.w->items();
    const auto g = predicted(c, theta_before(bug, t, c),
                             all_parts(*fw.w, [N](int64_t) { return N; }));
    // Compared as G_t vs G_{t-1} + g_t (a difference would cancel).
    const auto want = t == 0 ? g : add(bug.steps[t - 1].grad, g);
    assert_close(name, bug.steps[t].grad, want, oracle_tolerance(),
                 "accumulated gradient");
  }
  record_case(name);
}

void step_every_micro_step() {
  const std::string name = "zero-grad.step-every-micro-step";
  const Scenario s =
      *scenario(gradient_triggers({Pitfall::step_every_micro_step}))
           .as("scenario");
  const Case c(s);
  EngineState<R> st;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::step_every_micro_step}, s.optimizer.lr, &st);
  const auto windows = flatten(c.plan);
  int64_t micro_total = 0;
  for (const auto& fw : windows) micro_total += int64_t(fw.w->micro.size());
  // K updates per window; Adam's t counts micro-steps.
  RC_ASSERT(int64_t(bug.steps.size()) == micro_total);
  RC_ASSERT(st.optimizer_steps == micro_total);
  size_t t = 0;
  for (const auto& fw : windows) {
    const int64_t N = fw.w->items();
    for (size_t k = 0; k < fw.w->micro.size(); ++k, ++t) {
      // Partial sums: G_k - G_{k-1} = micro-batch k at the params after
      // step k-1, weighted 1/N_w.
      const auto g =
          predicted(c, theta_before(bug, t, c),
                    parts(*fw.w, k, k + 1, [N](int64_t) { return N; }));
      const auto want = k == 0 ? g : add(bug.steps[t - 1].grad, g);
      assert_close(name, bug.steps[t].grad, want, oracle_tolerance(),
                   "partial sum");
    }
  }
  record_case(name);
}

// ---------------------------------------------------------------------------
// (d) Partial final windows.

void partial_correct_own_count() {
  const std::string name = "partial.correct-weighs-1-over-n";
  Triggers t = gradient_triggers({});
  t.partial_window = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> run = c.run(c.plan, {}, s.optimizer.lr);
  // Every window, the partial one included, weighs each of its samples
  // 1/N_w, and the windows of an epoch hold each sample exactly once.
  for (const auto& e : c.plan.epochs) {
    std::vector<int> seen(size_t(s.data.samples), 0);
    for (const auto& w : e.windows)
      for (const auto& m : w.micro)
        for (const auto& sh : m.shards)
          for (int64_t id : sh) ++seen[size_t(id)];
    if (s.batching.ranks == 1)
      for (int n : seen) RC_ASSERT(n == 1);
  }
  check_weights(name, c, run, [](const FlatWindow& fw) {
    const int64_t N = fw.w->items();
    return all_parts(*fw.w, [N](int64_t) { return N; });
  });
  record_case(name);
}

void partial_scale_by_k() {
  const std::string name = "partial.scale-by-k";
  Triggers t = gradient_triggers({Pitfall::partial_cycle_scale_by_k});
  t.partial_window = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::partial_cycle_scale_by_k}, s.optimizer.lr);
  // Partial windows: G = (1/K) sum_{k <= r} grad L_k, L_k the micro-batch
  // mean; full windows: correct, 1/N_w.
  check_weights(name, c, bug, [K](const FlatWindow& fw) {
    const int64_t R_ = ranks(*fw.w), N = fw.w->items();
    if (!fw.w->partial) return all_parts(*fw.w, [N](int64_t) { return N; });
    return all_parts(*fw.w, [=](int64_t b) { return K * b * R_; });
  });
  record_case(name);
}

void partial_drop() {
  const std::string name = "partial.drop";
  Triggers t = gradient_triggers({Pitfall::partial_cycle_drop});
  t.partial_window = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::partial_cycle_drop}, s.optimizer.lr);
  const auto windows = flatten(c.plan);
  int64_t full = 0;
  for (const auto& fw : windows) full += !fw.w->partial;
  RC_ASSERT(int64_t(bug.steps.size()) == full);
  for (const auto& st : bug.steps)
    RC_ASSERT(!windows[size_t(st.window)].w->partial);
  check_weights(name, c, bug, [](const FlatWindow& fw) {
    const int64_t N = fw.w->items();
    return all_parts(*fw.w, [N](int64_t) { return N; });
  });
  record_case(name);
}

void partial_leak() {
  const std::string name = "partial.leak";
  Triggers t = gradient_triggers({Pitfall::partial_cycle_leak});
  t.partial_window = true;
  Scenario s = *scenario(t).as("scenario");
  s.batching.epochs = 2;  // the leak crosses an epoch boundary
  const Case c(s);
  const int64_t K = s.batching.accumulation;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::partial_cycle_leak}, s.optimizer.lr);
  const auto windows = flatten(c.plan);
  RC_ASSERT(!bug.steps.empty());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const size_t w = size_t(bug.steps[i].window);
    RC_ASSERT(!windows[w].w->partial);
    // The full window weighs its samples 1/N_w; the previous epoch's
    // partial window, weighted 1/(K*b_k) by the `loss / K` loop, joins it
    // at the same parameters (no step happened in between).
    const int64_t N = windows[w].w->items();
    Parts ps = all_parts(*windows[w].w, [N](int64_t) { return N; });
    if (w > 0 && windows[w - 1].w->partial) {
      const int64_t R_ = ranks(*windows[w - 1].w);
      const Parts left =
          all_parts(*windows[w - 1].w, [=](int64_t b) { return K * b * R_; });
      ps.insert(ps.begin(), left.begin(), left.end());
    }
    const auto want = predicted(c, theta_before(bug, i, c), ps);
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "leaked gradient");
  }
  record_case(name);
}

// ---------------------------------------------------------------------------
// (e) Scheduler drift: exact lr sequences, past the horizon too.

void scheduler_drift() {
  const std::string name = "scheduler.drift";
  Triggers t;
  t.schedule = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const auto windows = flatten(c.plan);
  const int64_t K = s.batching.accumulation;
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  for (size_t i = 0; i < ok.steps.size(); ++i)
    RC_ASSERT(ok.steps[i].lr ==
              s.optimizer.lr * lr_multiplier(s.schedule, int64_t(i)));
  const Run<R> per_micro =
      c.run(c.plan, {Pitfall::scheduler_per_micro_step}, s.optimizer.lr);
  for (const auto& st : per_micro.steps) {
    // The boundary's scheduler.step() comes after optimizer.step():
    // micro-steps before this window plus this window's, minus one.
    const FlatWindow& fw = windows[size_t(st.window)];
    const int64_t n = fw.micro_before + int64_t(fw.w->micro.size()) - 1;
    RC_ASSERT(st.lr == s.optimizer.lr * lr_multiplier(s.schedule, n));
    if (!fw.w->partial && fw.micro_before == int64_t(st.window) * K)
      RC_ASSERT(st.lr == s.optimizer.lr *
                             lr_multiplier(s.schedule, st.step * K + K - 1));
  }
  const Run<R> slow =
      c.run(c.plan, {Pitfall::schedule_horizon_in_micro_steps}, s.optimizer.lr);
  // The horizon in the micro-batches of the real windows (M an epoch,
  // its last window partial where K does not divide M).
  const int64_t M = c.plan.epoch(0).micro_steps();
  const ScheduleSpec stretched_spec = stretched(s.schedule, K, M);
  for (size_t i = 0; i < slow.steps.size(); ++i) {
    RC_ASSERT(slow.steps[i].lr ==
              s.optimizer.lr * lr_multiplier(stretched_spec, int64_t(i)));
    // Where K divides M, K times too slowly, warmup included:
    // S'(K t) = S(t).
    if (M % K == 0)
      RC_ASSERT(lr_multiplier(stretched_spec, K * int64_t(i)) ==
                lr_multiplier(s.schedule, int64_t(i)));
  }
  record_case(name);
}

// ---------------------------------------------------------------------------
// (f) Clipping placement.

void clip_per_micro_step() {
  const std::string name = "clip.per-micro-step";
  Triggers t;
  t.pitfalls = {Pitfall::clip_per_micro_step};
  t.clip = true;
  t.no_weight_decay = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const double cmax = s.clip.max_norm;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::clip_per_micro_step}, s.optimizer.lr);
  const auto windows = flatten(c.plan);
  RC_ASSERT(!bug.steps.empty());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const FlatWindow& fw = windows[size_t(bug.steps[i].window)];
    const int64_t N = fw.w->items();
    const auto theta = theta_before(bug, i, c);
    // G <- clip(G + grad L_k / K) after each micro-step, computed here.
    std::vector<R> G(size_t(c.layout.total), R(0));
    bool early_clip = false;
    for (size_t k = 0; k < fw.w->micro.size(); ++k) {
      const auto g = predicted(
          c, theta, parts(*fw.w, k, k + 1, [N](int64_t) { return N; }));
      R norm2(0);
      for (size_t j = 0; j < G.size(); ++j) {
        G[j] += g[j];
        norm2 += G[j] * G[j];
      }
      using std::sqrt;
      const R coef = R(cmax) / (sqrt(norm2) + R(1e-6));
      if (coef < R(1)) {
        for (R& x : G) x *= coef;
        if (k + 1 < fw.w->micro.size()) early_clip = true;
      }
    }
    assert_close(name, bug.steps[i].grad, G, oracle_tolerance(),
                 "sequentially clipped gradient");
    // The correct gradient: clip once after accumulation.
    auto once =
        predicted(c, theta, all_parts(*fw.w, [N](int64_t) { return N; }));
    {
      R norm2(0);
      for (const R& x : once) norm2 += x * x;
      using std::sqrt;
      const R coef = R(cmax) / (sqrt(norm2) + R(1e-6));
      if (coef < R(1))
        for (R& x : once) x *= coef;
    }
    if (!early_clip) {
      assert_close(name, bug.steps[i].grad, once, oracle_tolerance(),
                   "equal to clip-once");
    } else {
      assert_differs_where_predicted(name, bug.steps[i].grad, G, once);
    }
  }
  record_case(name);
}

// ---------------------------------------------------------------------------
// (j) L2 in the loss and AdamW's decoupled decay.

void l2_unnormalized() {
  const std::string name = "decay.l2-in-loss-unnormalized";
  Triggers t = gradient_triggers({Pitfall::l2_in_loss_unnormalized});
  t.no_weight_decay = false;
  t.no_clip = true;
  Scenario s = *scenario(t).as("scenario");
  if (s.optimizer.l2_in_loss == 0) s.optimizer.l2_in_loss = 1.0 / 16;
  const Case c(s);
  const double lambda = s.optimizer.l2_in_loss;
  const auto windows = flatten(c.plan);
  for (bool buggy : {false, true}) {
    const Run<R> run =
        c.run(c.plan,
              buggy ? std::vector<Pitfall>{Pitfall::l2_in_loss_unnormalized}
                    : std::vector<Pitfall>{},
              s.optimizer.lr);
    for (size_t i = 0; i < run.steps.size(); ++i) {
      const FlatWindow& fw = windows[size_t(run.steps[i].window)];
      const int64_t N = fw.w->items();
      const auto theta = theta_before(run, i, c);
      auto want =
          predicted(c, theta, all_parts(*fw.w, [N](int64_t) { return N; }));
      // correct: lambda*theta once per window; buggy: K_w times.
      const R times = buggy ? R(int64_t(fw.w->micro.size())) : R(1);
      for (size_t j = 0; j < want.size(); ++j)
        want[j] += times * R(lambda) * theta[j];
      assert_close(name, run.steps[i].grad, want, oracle_tolerance(),
                   buggy ? "gradient with K_w*lambda*theta"
                         : "gradient with lambda*theta");
    }
  }
  record_case(name);
}

void adamw_decay_once_per_step() {
  const std::string name = "decay.adamw-once-per-step";
  Triggers t;
  t.adam = true;
  Scenario s = *scenario(t).as("scenario");
  s.optimizer.kind = OptimizerKind::adamw;
  if (s.optimizer.weight_decay == 0) s.optimizer.weight_decay = 1.0 / 8;
  const Case c(s);
  EngineState<R> end;
  const Run<R> run = c.run(c.plan, {}, s.optimizer.lr, &end);
  RC_ASSERT(end.optimizer_steps == int64_t(run.steps.size()));
  // One step from the final state with and without decay: they differ by
  // exactly -lr*wd*theta, i.e. the decay multiplies once per step.
  OptimizerSpec no_decay = s.optimizer;
  no_decay.weight_decay = 0;
  auto a = c.oracle(), b = c.oracle();
  a->set_state(end);
  b->set_state(end);
  const double lr = s.optimizer.lr;
  a->optimizer_step(s.optimizer, lr);
  b->optimizer_step(no_decay, lr);
  std::vector<R> diff = sub(a->state().params, b->state().params),
                 want(diff.size());
  for (size_t j = 0; j < want.size(); ++j)
    want[j] = -R(lr) * R(s.optimizer.weight_decay) * end.params[j];
  assert_close(name, diff, want, oracle_tolerance(), "decoupled decay");
  record_case(name);
}

// ---------------------------------------------------------------------------
// (k) Inertness: each pitfall changes nothing without its trigger.

void inertness() {
  const std::string name = "inertness.oracle";
  // zero-grad-never and seed-002-loop have no inert setting short of a
  // single step, so they are not drawn here.
  const Pitfall p =
      *rc::gen::element(
           Pitfall::no_loss_normalization, Pitfall::sample_mean_of_means,
           Pitfall::zero_grad_every_micro_step, Pitfall::step_every_micro_step,
           Pitfall::partial_cycle_scale_by_k, Pitfall::partial_cycle_drop,
           Pitfall::partial_cycle_leak, Pitfall::scheduler_per_micro_step,
           Pitfall::schedule_horizon_in_micro_steps,
           Pitfall::clip_per_micro_step, Pitfall::l2_in_loss_unnormalized,
           Pitfall::ramp_normalization_stale,
           Pitfall::ramp_schedule_horizon_fixed)
           .as("pitfall");
  Triggers t;
  t.pitfalls = {p};
  switch (p) {
    case Pitfall::no_loss_normalization:
    case Pitfall::zero_grad_every_micro_step:
    case Pitfall::step_every_micro_step:
    case Pitfall::clip_per_micro_step:
    case Pitfall::l2_in_loss_unnormalized:
      t.accumulation = false;  // K = 1 below
      break;
    case Pitfall::sample_mean_of_means:
    case Pitfall::partial_cycle_scale_by_k:
    case Pitfall::partial_cycle_drop:
    case Pitfall::partial_cycle_leak:
      t.full_windows = true;  // equal micro-batches, no partial window
      break;
    default:
      break;
  }
  Scenario s = *scenario(t).as("scenario");
  if (!t.accumulation) {
    s.batching.accumulation = 1;
  }
  if (p == Pitfall::scheduler_per_micro_step ||
      p == Pitfall::schedule_horizon_in_micro_steps)
    s.schedule.kind = ScheduleKind::constant;
  if (p == Pitfall::ramp_schedule_horizon_fixed) {
    // K never changes: the horizon computed with K_0 is the horizon.
    s.schedule.kind = ScheduleKind::linear;
    s.schedule.total_auto = true;
  }
  const Case c(s);
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  const Run<R> bug = c.run(c.plan, {p}, s.optimizer.lr);
  RC_ASSERT(ok.windows.size() == bug.windows.size());
  RC_ASSERT(ok.steps.size() == bug.steps.size());
  for (size_t w = 0; w < ok.windows.size(); ++w)
    assert_close(name, bug.windows[w].param, ok.windows[w].param,
                 oracle_tolerance(), "parameters without the trigger");
  record_case(name);
}

}  // namespace

const std::vector<Property>& all_properties() {
  static const std::vector<Property> props = [] {
    std::vector<Property> v = oracle_properties();
    for (const Property& p : norm_properties()) v.push_back(p);
    for (const Property& p : ramp_properties()) v.push_back(p);
    for (const Property& p : loop_properties()) v.push_back(p);
    for (const Property& p : framework_loop_properties()) v.push_back(p);
    for (const Property& p : contract_properties()) v.push_back(p);
    for (const Property& p : ddp_properties()) v.push_back(p);
    for (const Property& p : precision_properties()) v.push_back(p);
    for (const Property& p : device_properties()) v.push_back(p);
    return v;
  }();
  return props;
}

const std::vector<Property>& oracle_properties() {
  static const std::vector<Property> props = {
      {"equivalence.oracle", "oracle",
       "correct accumulation equals the large batch: gradients, parameters, "
       "Adam moments, steps",
       equivalence_oracle},
      {"loss-normalization.no-loss-normalization", "oracle",
       "no-loss-normalization weighs each sample 1/b_k (G = K*g for equal "
       "micro-batches)",
       no_loss_normalization_weights},
      {"loss-normalization.sgd-at-k-lr", "oracle",
       "no-loss-normalization under plain SGD is correct at K*lr, whole "
       "trajectory",
       no_loss_normalization_is_k_times},
      {"loss-normalization.adam-eps-over-k", "oracle",
       "no-loss-normalization under Adam is correct with eps/K, whole "
       "trajectory",
       no_loss_normalization_adam_eps},
      {"loss-normalization.sample-mean-of-means", "oracle",
       "sample-mean-of-means weighs a sample 1/(K*b_k)",
       sample_mean_of_means_weights},
      {"loss-normalization.summed-loss-divided-by-k", "oracle",
       "summed-loss-divided-by-k weighs every item 1/K (not 1/N_w: b_k "
       "times too much)",
       summed_loss_divided_by_k_weights},
      {"zero-grad.every-micro-step", "oracle",
       "zero-grad-every-micro-step: G = the last micro-batch / N_w",
       zero_grad_every_micro_step},
      {"zero-grad.seed-002-loop", "oracle",
       "seed-002-loop: one step per epoch iff K divides it, with the last "
       "micro-batch / K",
       seed_002_loop},
      {"zero-grad.never", "oracle",
       "zero-grad-never: G_t = sum of g_s at their own theta_s",
       zero_grad_never},
      {"zero-grad.step-every-micro-step", "oracle",
       "step-every-micro-step: K updates per window on partial sums, Adam's t "
       "counts micro-steps",
       step_every_micro_step},
      {"partial.correct-weighs-1-over-n", "oracle",
       "correct weighs every sample of an epoch once, 1/N_w, partial windows "
       "included",
       partial_correct_own_count},
      {"partial.scale-by-k", "oracle",
       "partial-cycle-scale-by-k: G = (1/K) sum_{k<=r} grad L_k",
       partial_scale_by_k},
      {"partial.drop", "oracle",
       "partial-cycle-drop: partial windows never stepped", partial_drop},
      {"partial.leak", "oracle",
       "partial-cycle-leak: leftovers join the next epoch's first window",
       partial_leak},
      {"scheduler.drift", "oracle",
       "lr at step t: S(t) correct, S(tK+K-1) per-micro-step, S stretched K "
       "times for the horizon bug",
       scheduler_drift},
      {"clip.per-micro-step", "oracle",
       "clip-per-micro-step clips partial sums; equals clip-once when no "
       "partial sum exceeds c",
       clip_per_micro_step},
      {"decay.l2-in-loss-unnormalized", "oracle",
       "L2 in the loss adds lambda*theta once per window; unnormalized, K_w "
       "times",
       l2_unnormalized},
      {"decay.adamw-once-per-step", "oracle",
       "AdamW multiplies by (1 - lr*wd) once per step",
       adamw_decay_once_per_step},
      {"inertness.oracle", "oracle",
       "each pitfall changes nothing without its trigger", inertness},
  };
  return props;
}

}  // namespace accumcheck::properties
