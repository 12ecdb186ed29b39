// certify's lr channel (verify/certify/lr_channel.hpp).
#include "verify/certify/lr_channel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "oracle/error_model.hpp"
#include "sim/k_schedule.hpp"
#include "sim/lr_schedule.hpp"
#include "sim/trainer.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck {

namespace {

// How near two lrs must be to be the same: rel of the larger plus abs_lr
// (a float32 schedule's error in units of its base lr, 0 for one held in
// double).  Ratios of lrs are compared by rel alone (abs_lr 0).
struct LrBound {
  double rel = 0;
  double abs_lr = 0;
  bool same(double a, double b) const {
    return std::fabs(a - b) <=
           rel * std::max(std::fabs(a), std::fabs(b)) + abs_lr;
  }
};

// The horizon T != the accepted one over which a linear or cosine schedule
// gives every step's lr (step t at S(t)), a warmup ratio taken of T as the
// schedule's own is; 0 when none does.  T runs up to twice the accepted
// horizon and the steps the trace took: a budget counted short or long.
int64_t shorter_horizon(const Scenario& s, const std::vector<double>& lr,
                        const LrBound& bound) {
  const ScheduleSpec sc = resolved_schedule(s);
  if (sc.table ||
      (sc.kind != ScheduleKind::linear && sc.kind != ScheduleKind::cosine))
    return 0;
  const int64_t most = 2 * std::max<int64_t>(sc.total, int64_t(lr.size()));
  for (int64_t T = 1; T <= most; ++T) {
    if (T == sc.total) continue;
    const ScheduleSpec h = with_horizon(sc, T);
    bool all = true;
    for (size_t i = 0; i < lr.size() && all; ++i)
      all = bound.same(lr[i], s.optimizer.lr * lr_multiplier(h, int64_t(i)));
    if (all) return T;
  }
  return 0;
}

}  // namespace

LrChannel check_lr(const Scenario& s, const Plan& plan, const TraceRun& run,
                   const Behavior& accepted, bool lr_float32) {
  LrChannel c;
  std::vector<int64_t> epoch_of;
  for (const TraceEvent& te : run.events)
    if (te.event.kind == EventKind::optimizer_step && te.event.rank == 0) {
      // With R ranks every rank records its step; rank 0's stand for all.
      c.trace_lr.push_back(te.event.lr);
      epoch_of.push_back(te.event.epoch);
    }
  if (c.trace_lr.empty() ||
      std::any_of(c.trace_lr.begin(), c.trace_lr.end(),
                  [](double x) { return std::isnan(x); })) {
    c.message = "lr not checked: the trace's optimizer_step events carry no lr";
    return c;
  }
  c.checked = true;
  NullEngine null;
  TrainerOptions opt;
  opt.record_values = false;
  opt.max_steps = s.batching.max_steps;
  Trainer<NullEngine> t(null, s, accepted, s.optimizer.lr, opt);
  for (const StepRecord<double>& st : t.run(plan, "lr").steps)
    c.accepted_lr.push_back(st.lr);
  // A schedule evaluated in float32 errs absolutely too, in units of its
  // base lr: near a decay's end (1 + cos(pi t / T), init + (end - init) t
  // / T) that is many units of the lr itself.
  const LrBound bound{
      error_model::tolerance(lr_float32 ? "lr_channel_rel_float32"
                                        : "lr_channel_rel"),
      lr_float32 ? error_model::tolerance("lr_channel_abs_float32") *
                       std::fabs(s.optimizer.lr)
                 : 0.0};
  const size_t n = std::min(c.trace_lr.size(), c.accepted_lr.size());
  for (size_t i = 0; i < n && c.first_off < 0; ++i)
    if (!bound.same(c.trace_lr[i], c.accepted_lr[i])) c.first_off = int64_t(i);
  c.ok = c.first_off < 0;
  if (c.ok) {
    c.message = fmt::format(
        "lr: every optimizer step's lr is the accepted schedule's ({} "
        "steps{})",
        n,
        c.trace_lr.size() != c.accepted_lr.size()
            ? fmt::format("; the trace has {}, the schedule {}",
                          c.trace_lr.size(), c.accepted_lr.size())
            : std::string());
    return c;
  }
  const size_t t0 = size_t(c.first_off);
  c.message = fmt::format(
      "lr: step {} used lr {:.9g}, the accepted schedule gives {:.9g}", t0,
      c.trace_lr[t0], c.accepted_lr[t0]);

  // What the sequence is instead.
  const double K = double(s.batching.accumulation);
  auto all = [&](auto&& pred) {
    for (size_t i = 0; i < n; ++i)
      if (!pred(i)) return false;
    return true;
  };
  // A constant ratio (steps where the schedule is 0 must be 0 too).
  double ratio = 0;
  for (size_t i = 0; i < n && ratio == 0; ++i)
    if (c.accepted_lr[i] != 0) ratio = c.trace_lr[i] / c.accepted_lr[i];
  const bool constant_ratio =
      ratio != 0 && all([&](size_t i) {
        return bound.same(c.trace_lr[i], ratio * c.accepted_lr[i]);
      });
  const double base = s.optimizer.lr;
  auto S = [&](int64_t k) { return base * lr_multiplier(s.schedule, k); };
  if (std::isnan(c.accepted_lr[t0])) {
    // A declared table (schedule.csv) this semantics runs past.
    c.evidence = fmt::format(
        "the accepted loop's scheduler is past the declared schedule's "
        "table ({} scheduler.step() counts) at step {}",
        s.schedule.table ? s.schedule.table->size() : 0, t0);
  } else if (constant_ratio && LrBound{bound.rel}.same(ratio, K)) {
    c.evidence = fmt::format(
        "lr at every step is K x the schedule (K = {}: the linear scaling "
        "rule)",
        s.batching.accumulation);
  } else if (constant_ratio && LrBound{bound.rel}.same(ratio, std::sqrt(K))) {
    c.evidence = fmt::format(
        "lr at every step is sqrt(K) x the schedule (K = {}: the square-root "
        "scaling rule)",
        s.batching.accumulation);
  } else if (constant_ratio) {
    c.evidence =
        fmt::format("lr at every step is {:.6g} x the schedule", ratio);
  } else if (all([&](size_t i) {
               return bound.same(c.trace_lr[i], S(int64_t(i) + 1));
             })) {
    c.evidence =
        "the lr sequence is the schedule one step ahead: step t uses "
        "S(t+1) (scheduler.step() before optimizer.step())";
  } else if (all([&](size_t i) {
               return bound.same(c.trace_lr[i], S(epoch_of[i]));
             })) {
    c.evidence =
        "lr constant within each epoch, S(epoch) (the scheduler stepped once "
        "per epoch)";
  } else if (const int64_t T = shorter_horizon(s, c.trace_lr, bound); T > 0) {
    c.evidence = fmt::format(
        "the lr sequence is the schedule over a horizon of {} steps, not {} "
        "(the scheduler built with another step count: a trainer's step "
        "budget)",
        T, resolved_schedule(s).total);
  } else {
    c.evidence = c.accepted_lr[t0] != 0
                     ? fmt::format("lr ratio at step {}: {:.6g} x the schedule",
                                   t0, c.trace_lr[t0] / c.accepted_lr[t0])
                     : fmt::format(
                           "no fixed ratio to the schedule (it gives 0 at "
                           "step {})",
                           t0);
  }
  return c;
}

}  // namespace accumcheck
