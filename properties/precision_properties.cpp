// Properties of precision, loss scaling and the training state beyond
// gradients (issue 13): low-precision gradient buffers against the error
// model's K-term bound, GradScaler's skip / back-off / growth, and the
// pitfalls clip-before-unscale, scaler-update-every-micro-step,
// skipped-step-advances-scheduler, accumulator-rescaled,
// ema-every-micro-step, optimizer-state-every-micro-step and
// low-precision-grad-buffer.  Each prediction is written from the
// pitfall's story (which factor each micro-batch gets, which state moves
// when), from micro-batch gradients computed outside the trainer switch
// it checks.
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/emulated.hpp"
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "gpu/cuda/cuda_executor.hpp"
#endif
#include "oracle/error_model.hpp"
#include "oracle/tracked.hpp"
#include "properties/device_properties.hpp"
#include "properties/generators.hpp"
#include "properties/harness.hpp"

namespace accumcheck::properties {

namespace {

using T = Tracked<OracleReal>;
using OT = Oracle<T>;

// A generated scenario with [precision] / [ema] settings applied (so a
// counterexample prints them).
rc::Gen<Scenario> with(const Triggers& t, std::function<void(Scenario&)> f) {
  return rc::gen::map(scenario(t), [f](Scenario s) {
    f(s);
    return s;
  });
}

// One micro-batch's gradient, weighted 1/N, at theta (an oracle of its own).
std::vector<R> micro_gradient(const Case& c, const std::vector<R>& theta,
                              const std::vector<int64_t>& shard, int64_t N,
                              int64_t epoch) {
  return predicted(c, theta, {{shard, N}}, epoch);
}

// Each window's shards (rank 0) and item count.
struct WindowParts {
  std::vector<std::vector<int64_t>> shards;
  int64_t N = 0;
  int64_t epoch = 0;
};
std::vector<WindowParts> window_parts(const Case& c) {
  std::vector<WindowParts> out;
  auto o = c.oracle();
  for (size_t e = 0; e < c.plan.epochs.size(); ++e)
    for (const Window& w : c.plan.epochs[e].windows) {
      WindowParts p;
      p.epoch = int64_t(e);
      for (const MicroBatch& m : w.micro) {
        p.shards.push_back(m.shards.front());
        p.N += o->items(m.shards.front());
      }
      out.push_back(std::move(p));
    }
  return out;
}

// ---------------------------------------------------------------------------
// Low-precision buffers on the device, against the error model's bound of
// a K-term sum (error_model::lowp_sum_bound), the terms the Tracked
// oracle's single backward passes from the same state.

struct ValueBound {
  OracleReal v, e;
};

template <class Dev>
void buffer_bound_device() {
  const std::string name = "precision.buffer-bound." + engine_name<Dev>();
  const GradBuffer buf =
      *rc::gen::element(GradBuffer::bf16, GradBuffer::fp16).as("grad_buffer");
  Triggers t;
  t.no_clip = true;
  t.no_weight_decay = true;
  const Scenario s = *with(t, [buf](Scenario& x) {
                        x.precision.grad_buffer = buf;
                      }).as("scenario");
  const Case c(s);
  Dev dev(s.model, c.data, c.init);
  Trainer<Dev> dt(dev, s, behavior_of({}), s.optimizer.lr);
  const Window& w = c.plan.epochs.at(0).windows.at(0);
  const Run<float> d = dt.run_window(w, s.batching.accumulation, {});
  RC_ASSERT(d.steps.size() == 1u);
  RC_ASSERT(dev.grad_buffer() == buf);
  // The Tracked oracle's terms: each micro-batch's backward alone, weight
  // 1/N_w, from the initial state.
  OT probe(s.model, c.data, c.init);
  int64_t N = 0;
  for (const MicroBatch& m : w.micro) N += probe.items(m.shards.front());
  const size_t P = c.init.size();
  std::vector<OracleReal> sum(P, OracleReal(0)), abs_sum(P, OracleReal(0)),
      e_sum(P, OracleReal(0));
  const int64_t K = int64_t(w.micro.size());
  for (const MicroBatch& m : w.micro) {
    OT o(s.model, c.data, c.init);
    o.zero_grad();
    o.forward_backward(m.shards.front(), LossWeight{1, N});
    for (size_t i = 0; i < P; ++i) {
      using std::abs;
      sum[i] += o.grads()[i].v;
      abs_sum[i] += abs(o.grads()[i].v);
      e_sum[i] += o.grads()[i].e;
    }
  }
  std::vector<ValueBound> want(P);
  for (size_t i = 0; i < P; ++i)
    want[i] = {sum[i], OracleReal(error_model::lowp_sum_bound(
                           buf, K, static_cast<double>(abs_sum[i]),
                           static_cast<double>(e_sum[i])))};
  const error_model::Comparison cmp = error_model::compare(
      "accumulated gradient (" +
          std::string(buf == GradBuffer::bf16 ? "bf16" : "fp16") + ")",
      d.steps[0].grad, want, &c.layout);
  record_ratio(name, cmp.max_ratio);
  if (!cmp.ok()) RC_FAIL(cmp.summary());
  // The buffer holds values of its format (no float32 bits beyond it).
  for (float g : d.steps[0].grad)
    RC_ASSERT(kern::round_to(kern::Fmt(int32_t(buf)), g) == g || g != g);
  record_case(name);
}

// The oracle's low-precision-grad-buffer trainer: each window's gradient is
// the bf16 sum s = rnd(s + rnd(t_k)) of its exact micro-batch terms.
void low_precision_grad_buffer() {
  const std::string name = "precision.low-precision-grad-buffer";
  Triggers t;
  t.no_clip = true;
  t.no_weight_decay = true;
  t.single_epoch = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::low_precision_grad_buffer}, s.optimizer.lr);
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  const auto parts = window_parts(c);
  RC_ASSERT(bug.steps.size() == parts.size());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    std::vector<R> want(c.init.size(), R(0)), exact = want;
    for (const auto& sh : parts[i].shards) {
      const std::vector<R> g =
          micro_gradient(c, theta, sh, parts[i].N, parts[i].epoch);
      for (size_t j = 0; j < g.size(); ++j) {
        want[j] = round_to_buffer(
            R(want[j] + round_to_buffer(g[j], GradBuffer::bf16)),
            GradBuffer::bf16);
        exact[j] += g[j];
      }
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "bf16-buffer gradient vs the rounded sum of its terms");
    if (i == 0)
      assert_differs_where_predicted(name, bug.steps[0].grad, want,
                                     ok.steps[0].grad);
  }
  record_case(name);
}

// Every step of `bug` against sum_k weight(K-1-k) g_k: g_k micro-batch
// k's gradient (weight 1/N_w) at the step's parameters, K the window's
// micro-batches (weight's argument: the micro-batches after k).
template <class Weight>
void assert_micro_weights(const std::string& name, const Case& c,
                          const Run<R>& bug, Weight weight, const char* what) {
  const auto parts = window_parts(c);
  RC_ASSERT(bug.steps.size() == parts.size());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    const size_t K = parts[i].shards.size();
    std::vector<R> want(c.init.size(), R(0));
    for (size_t k = 0; k < K; ++k) {
      const std::vector<R> g = micro_gradient(c, theta, parts[i].shards[k],
                                              parts[i].N, parts[i].epoch);
      const R f = weight(int64_t(K - 1 - k));
      for (size_t j = 0; j < g.size(); ++j) want[j] += f * g[j];
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(), what);
  }
}

// ---------------------------------------------------------------------------
// GradScaler

// A scenario with dynamic loss scaling at 2^init_exp, growth every
// `interval` clean steps.
void scaling(Scenario& s, int64_t init_exp, int64_t interval) {
  s.precision.loss_scaling = true;
  s.precision.scale_exp = init_exp;
  s.precision.growth_interval = interval;
}

// Loss scaling by powers of two is exact: the correct trainer with a
// scaler (no overflow) takes exactly the steps of the one without.
void scaler_exact() {
  const std::string name = "scaler.exact-powers-of-two";
  Triggers t;
  const int64_t init = *rc::gen::inRange<int64_t>(-8, 20).as("init_exp");
  const int64_t every = *rc::gen::inRange<int64_t>(1, 4).as("interval");
  const Scenario s =
      *with(t, [&](Scenario& x) { scaling(x, init, every); }).as("scenario");
  const Case c(s);
  const Run<R> scaled = c.run(c.plan, {}, s.optimizer.lr);
  Scenario plain = s;
  plain.precision = PrecisionSpec{};
  const Case cp(plain);
  const Run<R> ref = cp.run(cp.plan, {}, s.optimizer.lr);
  RC_ASSERT(scaled.steps.size() == ref.steps.size());
  RC_ASSERT(!scaled.steps.empty());
  for (size_t i = 0; i < ref.steps.size(); ++i) {
    assert_close(name, scaled.steps[i].grad, ref.steps[i].grad,
                 oracle_tolerance(), "scaled vs unscaled gradient");
    assert_close(name, scaled.steps[i].param, ref.steps[i].param,
                 oracle_tolerance(), "scaled vs unscaled parameters");
  }
  // The scale grew by 2 every `every` clean steps.
  int64_t updates = 0;
  for (const Event& e : scaled.events)
    if (e.kind == EventKind::scaler_update) {
      ++updates;
      RC_ASSERT(e.loss_scale == std::ldexp(1.0, int(init + updates / every)));
    }
  RC_ASSERT(updates == int64_t(scaled.steps.size()));
  record_case(name);
}

// A skipped step (overflow injected at one window) leaves parameters,
// optimizer state, the scheduler and the EMA untouched, and backs the
// scale off; skipped-step-advances-scheduler moves the scheduler anyway.
void scaler_skip(bool pitfall) {
  const std::string name = pitfall ? "scaler.skipped-step-advances-scheduler"
                                   : "scaler.skip-leaves-state";
  Triggers t;
  t.schedule = true;
  t.min_ranks = 1;
  Scenario s0 = *with(t, [](Scenario& x) {
                   scaling(x, 12, 2);
                   x.ema.enabled = true;
                   x.ema.decay = 0.75;
                 }).as("scenario");
  const Case probe(s0);
  int64_t windows = 0;
  for (const auto& e : probe.plan.epochs) windows += int64_t(e.windows.size());
  const int64_t hit = *rc::gen::inRange<int64_t>(0, windows).as("window");
  const int64_t micro_count = [&] {
    int64_t n = 0;
    for (const auto& e : probe.plan.epochs)
      for (const Window& w : e.windows)
        if (n++ == hit) return int64_t(w.micro.size());
    return int64_t(1);
  }();
  const int64_t micro =
      *rc::gen::inRange<int64_t>(0, micro_count).as("micro-step");
  s0.precision.overflow = {{hit, micro}};
  const Scenario& s = s0;
  const Case c(s);
  auto o = c.oracle();
  const std::vector<Pitfall> p =
      pitfall ? std::vector<Pitfall>{Pitfall::skipped_step_advances_scheduler}
              : std::vector<Pitfall>{};
  Trainer<O> tr(*o, s, behavior_of(p), s.optimizer.lr);
  tr.set_ema(std::vector<R>(c.init.begin(), c.init.end()));
  TrainerCounters counters;
  int64_t index = 0, expect_exp = 12, tracker = 0;
  bool skipped = false;
  for (const auto& e : c.plan.epochs)
    for (size_t wi = 0; wi < e.windows.size(); ++wi, ++index) {
      const EngineState<R> before = o->state();
      const std::vector<R> ema_before = tr.ema();
      const TrainerCounters cb = counters;
      const Run<R> r =
          tr.run_window(e.windows[wi], e.accumulation, counters,
                        wi + 1 == e.windows.size(), e.micro_steps());
      counters = tr.counters();
      const EngineState<R> after = o->state();
      if (index == hit) {
        skipped = true;
        RC_ASSERT(r.steps.empty());
        RC_ASSERT(after.params == before.params);
        RC_ASSERT(after.exp_avg == before.exp_avg);
        RC_ASSERT(after.exp_avg_sq == before.exp_avg_sq);
        RC_ASSERT(after.optimizer_steps == before.optimizer_steps);
        RC_ASSERT(tr.ema() == ema_before);
        RC_ASSERT(counters.optimizer_steps == cb.optimizer_steps);
        RC_ASSERT(counters.scheduler_steps ==
                  cb.scheduler_steps + (pitfall ? 1 : 0));
        expect_exp -= 1;
        tracker = 0;
      } else {
        RC_ASSERT(r.steps.size() == 1u);
        RC_ASSERT(counters.scheduler_steps == cb.scheduler_steps + 1);
        RC_ASSERT(tr.ema() != ema_before || before.params == after.params);
        if (++tracker == 2) {
          expect_exp += 1;
          tracker = 0;
        }
      }
      RC_ASSERT(counters.scale_exp == expect_exp);
    }
  RC_ASSERT(skipped);
  record_case(name);
}
void scaler_skip_correct() { scaler_skip(false); }
void scaler_skip_pitfall() { scaler_skip(true); }

// clip-before-unscale: the clip sees S*G, so the step's gradient is
// G * min(1, c / (S |G| + 1e-6)) instead of G * min(1, c / (|G| + 1e-6)).
void clip_before_unscale() {
  const std::string name = "scaler.clip-before-unscale";
  Triggers t;
  t.clip = true;
  t.no_weight_decay = true;
  t.full_windows = true;
  const int64_t init = *rc::gen::inRange<int64_t>(0, 6).as("init_exp");
  const Scenario s =
      *with(t, [&](Scenario& x) { scaling(x, init, 1000000); }).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::clip_before_unscale}, s.optimizer.lr);
  const auto parts = window_parts(c);
  RC_ASSERT(bug.steps.size() == parts.size());
  const R S = R(std::ldexp(1.0, int(init)));
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    Parts ps;
    for (const auto& sh : parts[i].shards) ps.push_back({sh, parts[i].N});
    std::vector<R> g = predicted(c, theta, ps, parts[i].epoch);
    R sq(0);
    for (const R& x : g) sq += x * x;
    using std::sqrt;
    const R coef = R(float(s.clip.max_norm)) / (S * R(sqrt(sq)) + R(1e-6));
    if (coef < R(1))
      for (R& x : g) x *= coef;
    assert_close(name, bug.steps[i].grad, g, oracle_tolerance(),
                 "gradient clipped at c/S");
  }
  record_case(name);
}

// scaler-update-every-micro-step: the running sum is unscaled at every
// micro-step, so micro-batch k of K weighs S^-(K-1-k) / N (the scale held
// constant: growth_interval beyond the run).
void update_every_micro_step() {
  const std::string name = "scaler.update-every-micro-step";
  Triggers t;
  t.no_clip = true;
  t.no_weight_decay = true;
  t.full_windows = true;
  t.k_power_of_two = true;
  const int64_t init = *rc::gen::inRange<int64_t>(1, 8).as("init_exp");
  const Scenario s =
      *with(t, [&](Scenario& x) { scaling(x, init, 1000000); }).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::scaler_update_every_micro_step}, s.optimizer.lr);
  assert_micro_weights(
      name, c, bug,
      [&](int64_t later) { return R(std::ldexp(1.0, -int(init * later))); },
      "micro-batch k weighs S^-(K-1-k)/N");
  record_case(name);
}

// ---------------------------------------------------------------------------
// The state beyond gradients

// accumulator-rescaled: micro-batch k of K weighs 2^(K-1-k) / N.
void accumulator_rescaled() {
  const std::string name = "state.accumulator-rescaled";
  Triggers t;
  t.no_clip = true;
  t.no_weight_decay = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::accumulator_rescaled}, s.optimizer.lr);
  assert_micro_weights(
      name, c, bug,
      [](int64_t later) { return R(std::ldexp(1.0, int(later))); },
      "micro-batch k weighs 2^(K-1-k)/N");
  record_case(name);
}

// The EMA: after each step ema = d*ema + (1-d)*theta_{t+1}; with
// ema-every-micro-step, K_w - 1 more updates with theta_t before it.
void ema(bool pitfall) {
  const std::string name =
      pitfall ? "state.ema-every-micro-step" : "state.ema-per-step";
  Triggers t;
  const double decay = *rc::gen::element(0.5, 0.75, 0.9, 0.99).as("decay");
  const Scenario s = *with(t, [&](Scenario& x) {
                        x.ema.enabled = true;
                        x.ema.decay = decay;
                      }).as("scenario");
  const Case c(s);
  const std::vector<Pitfall> p =
      pitfall ? std::vector<Pitfall>{Pitfall::ema_every_micro_step}
              : std::vector<Pitfall>{};
  const Run<R> run = c.run(c.plan, p, s.optimizer.lr);
  const auto parts = window_parts(c);
  RC_ASSERT(run.steps.size() == parts.size());
  std::vector<R> e(c.init.begin(), c.init.end());
  const R d(decay), rest(1.0 - decay);
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const std::vector<R> theta = theta_before(run, i, c);
    if (pitfall)
      for (size_t k = 0; k + 1 < parts[i].shards.size(); ++k)
        for (size_t j = 0; j < e.size(); ++j) e[j] = e[j] * d + theta[j] * rest;
    for (size_t j = 0; j < e.size(); ++j)
      e[j] = e[j] * d + run.steps[i].param[j] * rest;
    // The update right after step i: the first with i + 1 steps before it.
    const auto after = std::find_if(
        run.ema.begin(), run.ema.end(),
        [&](const EmaRecord<R>& u) { return u.steps == int64_t(i) + 1; });
    RC_ASSERT(after != run.ema.end());
    assert_close(name, after->ema, e, oracle_tolerance(), "EMA after the step");
  }
  record_case(name);
}
void ema_per_step() { ema(false); }
void ema_every_micro_step() { ema(true); }

// optimizer-state-every-micro-step: before each step, Adam's t advanced
// and AdamW's decay applied once per micro-step that does not step.  The
// replay: an oracle optimizer handed the window's gradient (computed
// here) with that state.
void optimizer_state_every_micro_step() {
  const std::string name = "state.optimizer-state-every-micro-step";
  Triggers t;
  t.adam = true;
  t.no_clip = true;
  t.no_weight_decay = true;
  const double wd = *rc::gen::element(0.0, 0.01, 0.1).as("weight_decay");
  const Scenario s = *with(t, [&](Scenario& x) {
                        x.optimizer.kind = OptimizerKind::adamw;
                        x.optimizer.weight_decay = wd;
                      }).as("scenario");
  const Case c(s);
  EngineState<R> final_state;
  const Run<R> bug = c.run(c.plan, {Pitfall::optimizer_state_every_micro_step},
                           s.optimizer.lr, &final_state);
  const auto parts = window_parts(c);
  RC_ASSERT(bug.steps.size() == parts.size());
  auto replay = c.oracle();
  int64_t micro = 0;
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    // Micro-batch k's backward sees the parameters decayed k times.
    const R mul(1.0 - bug.steps[i].lr * wd);
    std::vector<R> th = theta, g(theta.size(), R(0));
    for (size_t k = 0; k < parts[i].shards.size(); ++k) {
      if (k > 0)
        for (R& p : th) p = p * mul;
      const std::vector<R> gk =
          micro_gradient(c, th, parts[i].shards[k], parts[i].N, parts[i].epoch);
      for (size_t j = 0; j < g.size(); ++j) g[j] += gk[j];
    }
    EngineState<R> st = replay->state();
    const int64_t extra = int64_t(parts[i].shards.size()) - 1;
    st.params = th;
    st.optimizer_steps += extra;
    st.grads = g;
    replay->set_state(st);
    replay->optimizer_step(s.optimizer, bug.steps[i].lr);
    micro += extra + 1;
    assert_close(name, bug.steps[i].param, replay->state().params,
                 oracle_tolerance(), "AdamW step with t and decay per micro");
  }
  RC_ASSERT(final_state.optimizer_steps == micro);
  record_case(name);
}

}  // namespace

const std::vector<Property>& precision_properties() {
  static const std::vector<Property> props = {
      {"precision.low-precision-grad-buffer", "oracle",
       "low-precision-grad-buffer: each window's gradient is the bf16 sum "
       "rnd(s + rnd(t_k)) of its exact micro-batch terms",
       low_precision_grad_buffer},
      {"scaler.exact-powers-of-two", "oracle",
       "dynamic loss scaling by powers of two takes exactly the unscaled "
       "steps; the scale doubles every growth_interval clean steps",
       scaler_exact},
      {"scaler.skip-leaves-state", "oracle",
       "a step skipped for an inf/NaN leaves parameters, optimizer state, "
       "scheduler and EMA untouched and halves the scale",
       scaler_skip_correct},
      {"scaler.skipped-step-advances-scheduler", "oracle",
       "skipped-step-advances-scheduler: the skipped step leaves the "
       "parameters but the scheduler advances",
       scaler_skip_pitfall},
      {"scaler.clip-before-unscale", "oracle",
       "clip-before-unscale: the step's gradient is clipped at c/S",
       clip_before_unscale},
      {"scaler.update-every-micro-step", "oracle",
       "scaler-update-every-micro-step: micro-batch k weighs S^-(K-1-k)/N",
       update_every_micro_step},
      {"state.accumulator-rescaled", "oracle",
       "accumulator-rescaled: micro-batch k weighs 2^(K-1-k)/N",
       accumulator_rescaled},
      {"state.ema-per-step", "oracle",
       "the EMA moves once per optimizer step: d*ema + (1-d)*theta_{t+1}",
       ema_per_step},
      {"state.ema-every-micro-step", "oracle",
       "ema-every-micro-step: K_w - 1 extra updates towards theta_t before "
       "the step's",
       ema_every_micro_step},
      {"state.optimizer-state-every-micro-step", "oracle",
       "optimizer-state-every-micro-step: AdamW's t and decay advance per "
       "micro-step; t ends at the run's micro-step count",
       optimizer_state_every_micro_step},
      {"precision.buffer-bound.device", "device",
       "bf16/fp16 gradient buffers stay within the error model's K-term "
       "bound of the oracle's exact sum",
       buffer_bound_device<EmulatedDevice>},
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
      {"precision.buffer-bound.cuda", "cuda",
       "bf16/fp16 gradient buffers on the CUDA executor stay within the "
       "error model's K-term bound",
       buffer_bound_device<CudaDevice>, true},
#endif
  };
  return props;
}

}  // namespace accumcheck::properties
