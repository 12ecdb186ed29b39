// The K-per-epoch properties (issue 16; sim/k_schedule.hpp): correct
// accumulation with K changing per epoch equals the large batch; the ramp
// pitfalls give their predicted gradients and lr sequences.  Oracle tier,
// exact (oracle_tolerance()); predictions from the plan, never from the
// trainer switch they check.
#include <rapidcheck.h>

#include <cmath>
#include <string>
#include <vector>

#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "properties/windows.hpp"
#include "sim/k_schedule.hpp"
#include "sim/lr_schedule.hpp"

namespace accumcheck::properties {

namespace {

// Gives the scenario 2..3 epochs with K drawn per epoch, K_1 != K_0.
void ramp_k(Scenario& s) {
  s.batching.epochs = *rc::gen::inRange<int64_t>(2, 4).as("epochs (ramp)");
  auto& ks = s.batching.accumulation_per_epoch;
  ks.clear();
  for (int64_t e = 0; e < s.batching.epochs; ++e)
    ks.push_back(*rc::gen::inRange<int64_t>(1, 6).as("K of the epoch"));
  if (ks[1] == ks[0]) ks[1] = ks[0] + 1;
  s.batching.accumulation = ks[0];
  s.batching.max_steps = -1;
  RC_ASSERT(k_changes(s.batching));
}

void ramp_equivalence() {
  const std::string name = "ramp.correct-equals-large-batch";
  Scenario s = *scenario(Triggers{}).as("scenario");
  ramp_k(s);
  const Case c(s);
  // The plan's windows hold K_e micro-batches in epoch e (the last one
  // fewer), so the run sees K change.
  for (size_t e = 0; e < c.plan.epochs.size(); ++e)
    for (const Window& w : c.plan.epochs[e].windows)
      RC_ASSERT(int64_t(w.micro.size()) <=
                s.batching.accumulation_per_epoch[e]);
  const Run<R> ref = c.run(as_large_batch(c.plan), {}, s.optimizer.lr);
  const Run<R> acc = c.run(c.plan, {}, s.optimizer.lr);
  RC_ASSERT(!acc.steps.empty());
  RC_ASSERT(acc.steps.size() == ref.steps.size());
  for (size_t t = 0; t < acc.steps.size(); ++t) {
    assert_close(name, acc.steps[t].grad, ref.steps[t].grad, oracle_tolerance(),
                 "gradient");
    assert_close(name, acc.steps[t].param, ref.steps[t].param,
                 oracle_tolerance(), "parameters");
  }
  record_case(name);
}

void ramp_normalization_stale() {
  const std::string name = "ramp.normalization-stale";
  const Pitfall p = Pitfall::ramp_normalization_stale;
  Scenario s = *scenario(gradient_triggers({p})).as("scenario");
  ramp_k(s);
  const Case c(s);
  const std::vector<int64_t> ks = s.batching.accumulation_per_epoch;
  const int64_t K0 = ks[0];
  const Run<R> bug = c.run(c.plan, {p}, s.optimizer.lr);
  // In the epochs whose K is not K_0 every micro-batch weighs 1/(K_0*b_k)
  // (the `loss / K_0` loop); epochs at K_0 keep correct's 1/N_w.
  auto stale = [&](const FlatWindow& fw) {
    const int64_t R_ = ranks(*fw.w), N = fw.w->items();
    if (ks[size_t(fw.epoch)] == K0)
      return all_parts(*fw.w, [N](int64_t) { return N; });
    return all_parts(*fw.w, [=](int64_t b) { return K0 * b * R_; });
  };
  check_weights(name, c, bug, stale);
  // It leaves correct (1/N_w) wherever that prediction differs.
  const auto windows = flatten(c.plan);
  bool asserted = false;
  for (size_t t = 0; t < bug.steps.size(); ++t) {
    const FlatWindow& fw = windows[size_t(bug.steps[t].window)];
    const int64_t N = fw.w->items();
    const auto theta = theta_before(bug, t, c);
    const auto want = predicted(c, theta, stale(fw));
    const auto ok =
        predicted(c, theta, all_parts(*fw.w, [N](int64_t) { return N; }));
    asserted =
        assert_differs_where_predicted(name, bug.steps[t].grad, want, ok) ||
        asserted;
  }
  RC_TAG(asserted ? "differs from correct" : "no predicted difference");
  record_case(name);
}

void ramp_schedule_horizon_fixed() {
  const std::string name = "ramp.schedule-horizon-fixed";
  Triggers t;
  t.pitfalls = {Pitfall::ramp_schedule_horizon_fixed};
  Scenario s = *scenario(t).as("scenario");
  ramp_k(s);
  s.schedule.kind =
      *rc::gen::element(ScheduleKind::linear, ScheduleKind::cosine)
           .as("schedule");
  s.schedule.total_auto = true;
  s.schedule.warmup = 0;
  s.schedule.warmup_ratio =
      *rc::gen::element(-1.0, 0.25, 0.5).as("warmup_ratio (-1: none)");
  const Case c(s);
  // Horizons counted on the plan: the windows of the run (correct), and
  // epochs * the windows of epoch 0 (computed once with the initial K).
  const int64_t total_ok = c.plan.windows();
  const int64_t total_bug =
      int64_t(c.plan.epochs.size()) * int64_t(c.plan.epochs[0].windows.size());
  auto sched = [&](int64_t total) {
    ScheduleSpec sc = s.schedule;
    sc.total = total;
    if (sc.warmup_ratio >= 0)
      sc.warmup = int64_t(std::ceil(double(total) * sc.warmup_ratio));
    return sc;
  };
  const Run<R> ok = c.run(c.plan, {}, s.optimizer.lr);
  const Run<R> bug =
      c.run(c.plan, {Pitfall::ramp_schedule_horizon_fixed}, s.optimizer.lr);
  RC_ASSERT(ok.steps.size() == bug.steps.size());
  bool differs = false;
  for (size_t i = 0; i < ok.steps.size(); ++i) {
    RC_ASSERT(ok.steps[i].lr ==
              s.optimizer.lr * lr_multiplier(sched(total_ok), int64_t(i)));
    RC_ASSERT(bug.steps[i].lr ==
              s.optimizer.lr * lr_multiplier(sched(total_bug), int64_t(i)));
    differs = differs || ok.steps[i].lr != bug.steps[i].lr;
  }
  // (Distinct horizons can still give equal lr sequences over a short run,
  // e.g. 3 steps with warmup 2 and totals 3 vs 4: each run is pinned to
  // its own formula above.)
  RC_TAG(differs ? "lr sequences differ" : "same lr sequence");
  record_case(name);
}

}  // namespace

const std::vector<Property>& ramp_properties() {
  static const std::vector<Property> props = {
      {"ramp.correct-equals-large-batch", "oracle",
       "K changing per epoch: correct accumulation equals the large batch "
       "over the same windows",
       ramp_equivalence},
      {"ramp.normalization-stale", "oracle",
       "ramp-normalization-stale weighs a sample 1/(K_0*b_k) where K_e != "
       "K_0; leaves correct where predicted",
       ramp_normalization_stale},
      {"ramp.schedule-horizon-fixed", "oracle",
       "total = auto: horizon sum_e ceil(M/K_e) correct, epochs*ceil(M/K_0) "
       "for ramp-schedule-horizon-fixed",
       ramp_schedule_horizon_fixed},
  };
  return props;
}

}  // namespace accumcheck::properties
