// The property battery, data parallelism (R ranks, DDP): every claim is
// exact in real arithmetic (oracle tier, oracle_tolerance()) except the
// device's repartition, judged against the derived float32 bound.
//
// Predictions are computed here, OUTSIDE the Trainer: the window's item
// count N_w is counted from the plan's sample ids over every rank, and
// gradients come from the oracle engine's forward_backward over the
// window's shards (harness.hpp predicted()), so a bug the trainer shares
// with its own large-batch reference cannot hide.
#include <rapidcheck.h>

#include <cmath>

#include "gpu/emulated.hpp"
#include "oracle/error_model.hpp"
#include "oracle/tracked.hpp"
#include "properties/device_properties.hpp"
#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "properties/windows.hpp"
#include "sim/lr_schedule.hpp"

namespace accumcheck::properties {

namespace {

// The optimizer step's window, found from the step record.
const FlatWindow& flat_window(const Plan& p, int64_t global) {
  static thread_local std::vector<FlatWindow> flat;
  flat = flatten(p);
  RC_ASSERT(global >= 0 && size_t(global) < flat.size());
  return flat[size_t(global)];
}
const Window& window_of(const Plan& p, int64_t global) {
  return *flat_window(p, global).w;
}
int64_t epoch_of(const Plan& p, int64_t global) {
  return flat_window(p, global).epoch;
}

// Sample ids of rank r (all ranks: r = -1) in window w, one part each
// micro-batch, weighted 1/den.
Parts shards_of(const Window& w, int64_t r, int64_t den) {
  Parts ps;
  for (const MicroBatch& m : w.micro)
    for (size_t q = 0; q < m.shards.size(); ++q)
      if ((r < 0 || int64_t(q) == r) && !m.shards[q].empty())
        ps.push_back({m.shards[q], den});
  return ps;
}

// N_w (r = -1) or rank r's N_{w,r}: sample losses, so the ids themselves.
int64_t count_ids(const Window& w, int64_t r = -1) {
  int64_t n = 0;
  for (const MicroBatch& m : w.micro)
    for (size_t q = 0; q < m.shards.size(); ++q)
      if (r < 0 || int64_t(q) == r) n += int64_t(m.shards[q].size());
  return n;
}

std::vector<R> scaled(std::vector<R> v, const R& f) {
  for (R& x : v) x *= f;
  return v;
}

Triggers ddp_triggers(std::vector<Pitfall> pitfalls, int min_ranks = 2) {
  Triggers t;
  t.pitfalls = std::move(pitfalls);
  t.min_ranks = min_ranks;
  t.max_ranks = 3;
  t.no_clip = true;          // predictions are of the raw gradient
  t.no_weight_decay = true;  // no L2 term in the loss
  return t;
}

// ---------------------------------------------------------------------------
// (a) The recorded gradient of correct DDP accumulation is
// (1/N_w) sum over every rank's shards, N_w counted here over all ranks.

void gradient_outside_trainer() {
  const std::string name = "ddp.gradient-outside-trainer";
  const Scenario s = *scenario(ddp_triggers({})).as("scenario");
  const Case c(s);
  const Run<R> run = c.run(c.plan, {}, s.optimizer.lr);
  RC_ASSERT(!run.steps.empty());
  for (size_t t = 0; t < run.steps.size(); ++t) {
    const Window& w = window_of(c.plan, run.steps[t].window);
    const auto want =
        predicted(c, theta_before(run, t, c), shards_of(w, -1, count_ids(w)),
                  epoch_of(c.plan, run.steps[t].window));
    assert_close(name, run.steps[t].grad, want, oracle_tolerance(),
                 "gradient vs the sum over every rank's shards / N_w");
    for (const auto& p : run.steps[t].rank_param)
      assert_close(name, p, run.steps[t].param, oracle_tolerance(),
                   "ranks hold identical parameters");
  }
  record_case(name);
}

// ---------------------------------------------------------------------------
// (b) Repartition invariance: the same global windows of G samples split
// over (R, K, b) any way give the same updates.

struct Split {
  int64_t R, K, b;
};
// Factorizations R*K*b = 12 with R <= 3.
constexpr Split kSplits12[] = {{1, 1, 12}, {1, 2, 6}, {1, 3, 4}, {1, 4, 3},
                               {1, 12, 1}, {2, 1, 6}, {2, 2, 3}, {2, 3, 2},
                               {2, 6, 1},  {3, 1, 4}, {3, 2, 2}, {3, 4, 1}};

Scenario with_split(Scenario s, const Split& sp) {
  s.batching.ranks = sp.R;
  s.batching.accumulation = sp.K;
  s.batching.micro_batch = sp.b;
  s.batching.sampler = Sampler::pad;  // R divides n: no padding
  return s;
}

std::pair<Scenario, Scenario> repartitioned(const Triggers& t) {
  Scenario s = *scenario(t).as("base scenario");
  const Split a =
      kSplits12[*rc::gen::inRange(0, 12).as("split A (index in kSplits12)")];
  const Split b =
      kSplits12[*rc::gen::inRange(0, 12).as("split B (index in kSplits12)")];
  s.data.samples = 12 * *rc::gen::inRange<int64_t>(1, 4).as("windows");
  return {with_split(s, a), with_split(s, b)};
}

void repartition_oracle() {
  const std::string name = "ddp.repartition.oracle";
  Triggers t;
  const auto [sa, sb] = repartitioned(t);
  const Case ca(sa), cb(sb);
  EngineState<R> fa, fb;
  const Run<R> ra = ca.run(ca.plan, {}, sa.optimizer.lr, &fa);
  const Run<R> rb = cb.run(cb.plan, {}, sb.optimizer.lr, &fb);
  RC_ASSERT(!ra.steps.empty());
  RC_ASSERT(ra.steps.size() == rb.steps.size());
  for (size_t i = 0; i < ra.steps.size(); ++i) {
    assert_close(name, ra.steps[i].grad, rb.steps[i].grad, oracle_tolerance(),
                 "gradient");
    assert_close(name, ra.steps[i].param, rb.steps[i].param, oracle_tolerance(),
                 "parameters");
  }
  if (!fa.exp_avg_sq.empty())
    assert_close(name, fa.exp_avg_sq, fb.exp_avg_sq, oracle_tolerance(),
                 "exp_avg_sq");
  record_case(name);
}

// Device: each split's first step within its own derived bound of the
// Tracked oracle, whose two values agree to the oracle's last digits.
void repartition_device() {
  const std::string name = "ddp.repartition.device";
  using T = Tracked<OracleReal>;
  Triggers t;
  t.no_clip = true;  // a clip decision may fall either way within the bound
  const auto [sa, sb] = repartitioned(t);
  std::vector<std::vector<OracleReal>> values;
  for (const Scenario* s : {&sa, &sb}) {
    const Case c(*s);
    const Window& w = c.plan.epochs[0].windows[0];
    const int64_t K = s->batching.accumulation;
    EmulatedDevice dev(s->model, c.data, c.init);
    Trainer<EmulatedDevice> dt(dev, *s, behavior_of({}), s->optimizer.lr);
    const Run<float> d = dt.run_window(w, K, {});
    Oracle<T> o(s->model, c.data, c.init);
    Trainer<Oracle<T>> ot(o, *s, behavior_of({}), s->optimizer.lr);
    const Run<T> r = ot.run_window(w, K, {});
    RC_ASSERT(d.steps.size() == 1u && r.steps.size() == 1u);
    for (const auto& [what, f, v] :
         {std::tuple{"gradient", &d.steps[0].grad, &r.steps[0].grad},
          std::tuple{"parameters", &d.steps[0].param, &r.steps[0].param}}) {
      const auto cmp = error_model::compare(what, *f, *v, &c.layout);
      record_ratio(name, cmp.max_ratio);
      if (!cmp.ok()) RC_FAIL(describe(*s) + ": " + cmp.summary());
    }
    values.emplace_back();
    for (const T& x : r.steps[0].param) values.back().push_back(x.v);
  }
  assert_close(name + ".oracle-values", values[0], values[1],
               oracle_tolerance(), "the two splits' exact updates");
  record_case(name);
}

// ---------------------------------------------------------------------------
// (c) Pitfalls.

// ddp-uneven-shards: a sample on rank r weighs 1/(R*N_{w,r}).
void rank_mean() {
  const std::string name = "ddp.uneven-shards";
  Triggers t = ddp_triggers({Pitfall::ddp_uneven_shards});
  t.sampler = Sampler::split;
  t.uneven_shards = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t Rk = s.batching.ranks;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::ddp_uneven_shards}, s.optimizer.lr);
  RC_ASSERT(!bug.steps.empty());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const Window& w = window_of(c.plan, bug.steps[i].window);
    Parts ps, ok;
    for (int64_t r = 0; r < Rk; ++r)
      for (auto& p : shards_of(w, r, Rk * count_ids(w, r))) ps.push_back(p);
    const auto theta = theta_before(bug, i, c);
    const auto want = predicted(c, theta, ps);
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "predicted gradient");
    const auto correct = predicted(c, theta, shards_of(w, -1, count_ids(w)));
    assert_differs_where_predicted(name, bug.steps[i].grad, want, correct);
  }
  record_case(name);
}

// ddp-no-sync-everywhere: rank 0 steps on (R/N_w) * its own shards; the
// ranks' parameters part where their local gradients differ.
void no_sync_everywhere() {
  const std::string name = "ddp.no-sync-everywhere";
  const Scenario s =
      *scenario(ddp_triggers({Pitfall::ddp_no_sync_everywhere})).as("scenario");
  const Case c(s);
  const int64_t Rk = s.batching.ranks;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::ddp_no_sync_everywhere}, s.optimizer.lr);
  RC_ASSERT(!bug.steps.empty());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const Window& w = window_of(c.plan, bug.steps[i].window);
    const auto want = scaled(
        predicted(c, theta_before(bug, i, c), shards_of(w, 0, count_ids(w))),
        R(Rk));
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "rank 0's local gradient");
  }
  RC_ASSERT(bug.steps[0].rank_param.size() == size_t(Rk - 1));
  const Window& w0 = window_of(c.plan, 0);
  const std::vector<R> theta0(c.init.begin(), c.init.end());
  const auto g0 = predicted(c, theta0, shards_of(w0, 0, count_ids(w0)));
  const auto g1 = predicted(c, theta0, shards_of(w0, 1, count_ids(w0)));
  if (rel(g1, g0) > oracle_tolerance() && bug.steps[0].lr > 0) {
    record_gap(name, rel(g1, g0) / oracle_tolerance());
    RC_ASSERT(rel(bug.steps[0].rank_param[0], bug.steps[0].param) >
              oracle_tolerance());
  }
  record_case(name);
}

// ddp-sync-every-micro-step: correct's values, one all_reduce per
// micro-step instead of one per stepped window.
void sync_every_micro_step() {
  const std::string name = "ddp.sync-every-micro-step";
  Triggers t = ddp_triggers({Pitfall::ddp_sync_every_micro_step}, 1);
  t.no_clip = t.no_weight_decay = false;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::ddp_sync_every_micro_step}, s.optimizer.lr);
  RC_ASSERT(ok.steps.size() == bug.steps.size());
  for (size_t i = 0; i < ok.steps.size(); ++i)
    assert_close(name, bug.steps[i].param, ok.steps[i].param,
                 oracle_tolerance(), "parameters");
  auto all_reduces = [](const Run<R>& r) {
    int64_t n = 0;
    for (const Event& e : r.events) n += e.kind == EventKind::all_reduce;
    return n;
  };
  int64_t micro_steps = 0;
  for (const EpochPlan& e : c.plan.epochs) micro_steps += e.micro_steps();
  const bool ranks = s.batching.ranks > 1;
  RC_ASSERT(all_reduces(ok) == (ranks ? int64_t(ok.steps.size()) : 0));
  RC_ASSERT(all_reduces(bug) == (ranks ? micro_steps : 0));
  record_case(name);
}

// ddp-clip-local-norm: chunk q of ceil(P/R) elements of the correct
// gradient scaled by min(1, c/(|chunk q| + 1e-6)).
void clip_local_norm() {
  const std::string name = "ddp.clip-local-norm";
  Triggers t = ddp_triggers({Pitfall::ddp_clip_local_norm});
  t.no_clip = false;
  t.clip = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const int64_t Rk = s.batching.ranks;
  const Run<R> bug =
      c.run(c.plan, {Pitfall::ddp_clip_local_norm}, s.optimizer.lr);
  RC_ASSERT(!bug.steps.empty());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const Window& w = window_of(c.plan, bug.steps[i].window);
    const auto theta = theta_before(bug, i, c);
    const auto raw = predicted(c, theta, shards_of(w, -1, count_ids(w)));
    std::vector<R> want = raw, global = raw;
    const size_t P = raw.size(), chunk = (P + size_t(Rk) - 1) / size_t(Rk);
    R total(0);
    for (const R& g : raw) total += g * g;
    const R gcoef = R(s.clip.max_norm) / (sqrt(total) + R(1e-6));
    if (gcoef < R(1)) global = scaled(raw, gcoef);
    for (size_t lo = 0; lo < P; lo += chunk) {
      R sq(0);
      for (size_t j = lo; j < std::min(P, lo + chunk); ++j)
        sq += raw[j] * raw[j];
      const R coef = R(s.clip.max_norm) / (sqrt(sq) + R(1e-6));
      if (coef < R(1))
        for (size_t j = lo; j < std::min(P, lo + chunk); ++j) want[j] *= coef;
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(),
                 "shard-clipped gradient");
    assert_differs_where_predicted(name, bug.steps[i].grad, want, global);
  }
  record_case(name);
}

// ddp-scheduler-per-rank: step t uses S(t*R).
void scheduler_per_rank() {
  const std::string name = "ddp.scheduler-per-rank";
  Triggers t = ddp_triggers({Pitfall::ddp_scheduler_per_rank}, 1);
  t.schedule = true;
  const Scenario s = *scenario(t).as("scenario");
  const Case c(s);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::ddp_scheduler_per_rank}, s.optimizer.lr);
  for (const auto& st : bug.steps)
    RC_ASSERT(st.lr ==
              s.optimizer.lr *
                  lr_multiplier(s.schedule, st.step * s.batching.ranks));
  record_case(name);
}

// Each DDP pitfall changes nothing with one rank; the rank means none
// with equal shards (padding) and sample losses.
void inertness_ddp() {
  const std::string name = "inertness.ddp";
  const Pitfall p =
      *rc::gen::element(
           Pitfall::ddp_token_mean_across_ranks, Pitfall::ddp_uneven_shards,
           Pitfall::ddp_no_sync_everywhere, Pitfall::ddp_clip_local_norm,
           Pitfall::ddp_scheduler_per_rank, Pitfall::ddp_clip_before_all_reduce)
           .as("pitfall");
  const bool rank_mean = p == Pitfall::ddp_token_mean_across_ranks ||
                         p == Pitfall::ddp_uneven_shards;
  Triggers t;
  t.pitfalls = {p};
  t.max_ranks = rank_mean ? 3 : 1;
  t.sampler = Sampler::pad;
  Scenario s = *scenario(t).as("scenario");
  // Padding makes the shards equal only when R divides n.
  if (rank_mean) s.data.samples -= s.data.samples % s.batching.ranks;
  RC_PRE(s.data.samples >= s.batching.ranks);
  const Case c(s);
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  const Run<R> bug = c.run(c.plan, {p}, s.optimizer.lr);
  RC_ASSERT(ok.steps.size() == bug.steps.size());
  for (size_t w = 0; w < ok.windows.size(); ++w)
    assert_close(name, bug.windows[w].param, ok.windows[w].param,
                 oracle_tolerance(), "parameters without the trigger");
  record_case(name);
}

}  // namespace

const std::vector<Property>& ddp_properties() {
  static const std::vector<Property> props = {
      {"ddp.gradient-outside-trainer", "oracle",
       "R ranks: each step's gradient is the sum over every rank's shards / "
       "N_w (N_w over all ranks), computed outside the Trainer; ranks agree",
       gradient_outside_trainer},
      {"ddp.repartition.oracle", "oracle",
       "the same global windows split over any (R, K, b) give the same "
       "updates, whole trajectory",
       repartition_oracle},
      {"ddp.repartition.device", "device",
       "each (R, K, b) split's float32 step lies within its derived bound of "
       "one exact update",
       repartition_device},
      {"ddp.uneven-shards", "oracle",
       "ddp-uneven-shards weighs a sample on rank r 1/(R*N_r)", rank_mean},
      {"ddp.no-sync-everywhere", "oracle",
       "ddp-no-sync-everywhere: each rank steps on R/N_w times its own "
       "shards; ranks diverge",
       no_sync_everywhere},
      {"ddp.sync-every-micro-step", "oracle",
       "ddp-sync-every-micro-step: correct's values, K times the all_reduce "
       "events",
       sync_every_micro_step},
      {"ddp.clip-local-norm", "oracle",
       "ddp-clip-local-norm clips each of R gradient chunks by its own norm",
       clip_local_norm},
      {"ddp.scheduler-per-rank", "oracle",
       "ddp-scheduler-per-rank: step t uses S(t*R)", scheduler_per_rank},
      {"inertness.ddp", "oracle",
       "each DDP pitfall changes nothing with one rank (rank means: equal "
       "shards)",
       inertness_ddp},
  };
  return props;
}

}  // namespace accumcheck::properties
