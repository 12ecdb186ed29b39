// certify, stage 2: the forced run of one semantics against the trace, and
// the accepted semantics' checks (verify/certify/stages.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "oracle/oracle.hpp"
#include "sim/limits.hpp"
#include "sim/trainer.hpp"
#include "verify/certify/parallel.hpp"
#include "verify/certify/stages.hpp"
#include "verify/certify/state_check.hpp"

namespace accumcheck::certify_detail {

namespace {

// Both from the one tolerance table (oracle/error_model.hpp), with reasons.
const double kFp64Scale = error_model::tolerance("fp64_bound_scale");
const double kProxyUlps = error_model::tolerance("certify_proxy_ulps");

// The clip factor PyTorch's clip_grad_norm_ applies for the pre-clip norm
// `n`: clamp(max_norm / (n + 1e-6), max = 1), computed in float32 as
// Tensor.__rdiv__ does it, max_norm * (1 / (n + 1e-6)) (three roundings;
// the one Trainer's float32 engine divides once, within the same bound),
// and multiplied always (by 1 when clamped).  Returns false where the
// factor is 1 for certain (no scaling); else `f`, whose Tracked bound
// holds the float32 factor whichever side of 1 it rounds to (the clamp
// is 1-Lipschitz: |min(f32, 1) - min(v, 1)| <= |f32 - v| <= e).
template <class T>
bool clip_factor(const T& n, double max_norm, T& f) {
  const T c = T(max_norm) * (T(1) / (n + T(1e-6)));
  if constexpr (std::is_same_v<T, double>) {
    f = c;
    return c < 1;
  } else {
    using V = decltype(c.v);
    if (!(c.v - c.e < V(1))) return false;
    f = T(c.v < V(1) ? c.v : V(1), c.e);
    return true;
  }
}

}  // namespace

// Not in the anonymous namespace: forced_run's lambdas capture a
// Trainer<Watched<...>>, and a type with internal linkage there is a
// -Wsubobject-linkage warning once this file is part of a unity build.
// An engine that judges the optimizer steps of one range only: what feeds
// a step outside it (forward_backward, L2, clipping, zeroing) is skipped,
// and the optimizer steps before it run on the trace's gradients and
// parameters only when the optimizer keeps state (momentum, Adam), so
// that the state at the range's first step is bit for bit a whole run's
// (teacher forcing: a step depends on the trace, never on the oracle's
// earlier steps).  Where that state is forced at the range's first step
// anyway (Adam's recorded moments, forced_run's assume_moments), they are
// counted only (`skip_before`).
//
// It clips itself (the Trainer's clip() hands it clip_grad_norm): the
// trainer's own pre-clip norm (ClipNorms: the trace's clip rows, call i
// of rank r at step t) forces the decision and the factor, so the clipped
// gradient is predicted as the trainer computed it, and the oracle's norm
// is kept to judge rank 0's recorded ones against (StepEval::norm).  A
// clip call with no recorded norm is decided by the oracle's own norm.
template <class Inner>
class Watched {
 public:
  using Real = typename Inner::Real;
  // A clip call of the current step: the oracle's norm, the recorded one.
  struct ForcedNorm {
    Real oracle;
    double recorded;
  };
  // `ranks`: every rank calls optimizer_step once per optimizer step.
  // `skip_before`: the optimizer's steps before the range are counted,
  // not taken (its state there is forced: forced_run's assume_moments).
  Watched(Inner& in, StepRange range, bool stateful, int64_t ranks,
          const ClipNorms& recorded, bool skip_before)
      : in_(in),
        range_(range),
        stateful_(stateful),
        skip_before_(skip_before),
        ranks_(std::max<int64_t>(ranks, 1)),
        recorded_(recorded) {}
  // The rank the Trainer runs (its rank()), set once the Trainer exists.
  void set_rank(std::function<int64_t()> rank) { rank_ = std::move(rank); }
  // Whether the current micro-batches feed a judged step.
  bool live() const { return range_.contains(steps()); }
  int64_t items(const std::vector<int64_t>& ids) const {
    return in_.items(ids);
  }
  void set_epoch(int64_t epoch) { in_.set_epoch(epoch); }
  // The gradient buffer's format (the Trainer sets it: bf16 for
  // low-precision-grad-buffer), passed on: without it the candidate was
  // `correct` in certify.
  void set_grad_buffer(GradBuffer b) { in_.set_grad_buffer(b); }
  void zero_grad() {
    if (live()) in_.zero_grad();
  }
  Real forward_backward(const std::vector<int64_t>& ids, LossWeight w) {
    if (!live()) return Real(0);
    return in_.forward_backward(ids, w);
  }
  void add_l2(double lambda, int64_t den) {
    if (live()) in_.add_l2(lambda, den);
  }
  Real grad_norm() const { return live() ? in_.grad_norm() : Real(0); }
  // clip_grad_norm_(max_norm): returns the norm the decision was made on.
  Real clip_grad_norm(double max_norm) {
    if (!live()) return Real(0);
    const int64_t t = steps();
    if (t != clip_step_) {
      clip_step_ = t;
      calls_of_rank_.clear();
      forced_.clear();
      unforced_ = 0;
    }
    const int64_t r = rank_ ? rank_() : 0;
    if (calls_of_rank_.size() <= size_t(r))
      calls_of_rank_.resize(size_t(r) + 1);
    const size_t i = size_t(calls_of_rank_[size_t(r)]++);
    const Real own = in_.grad_norm();
    Real used = own;
    const double* rec = recorded(t, r, i);
    // Every rank's decision is forced by its own recorded norm (a rank's
    // clipped gradient may feed the all-reduce); rank 0's norms are judged,
    // as its gradient is (the other ranks' oracle state is rank 0's trace,
    // which is theirs only when they step in sync).
    if (rec) {
      used = lift<Real>(*rec);
      if (r == 0) forced_.push_back({own, *rec});
    } else if (r == 0) {
      ++unforced_;
    }
    Real f;
    if (clip_factor(used, max_norm, f)) in_.scale_grads(f);
    return used;
  }
  void scale_grads(const Real& f) {
    if (live()) in_.scale_grads(f);
  }
  void optimizer_step(const OptimizerSpec& o, double lr) {
    const bool before = steps() < range_.begin;
    const bool after = !before && !live();
    if (before && skip_before_)
      in_.count_optimizer_step();
    else if (!after && (live() || stateful_))
      in_.optimizer_step(o, lr);
    ++calls_;
  }
  EngineState<Real> state() const { return in_.state(); }
  void set_state(const EngineState<Real>& s) { in_.set_state(s); }
  // Rank 0's clip calls of `step`, taken: forced, and how many were not.
  std::vector<ForcedNorm> take_forced(int64_t step, int64_t& unforced) {
    unforced = 0;
    if (step != clip_step_) return {};
    unforced = unforced_;
    unforced_ = 0;
    return std::exchange(forced_, {});
  }
  Inner& inner() { return in_; }

 private:
  Inner& in_;
  StepRange range_;
  bool stateful_;
  bool skip_before_;
  int64_t ranks_;
  const ClipNorms& recorded_;
  std::function<int64_t()> rank_;
  int64_t calls_ = 0;  // optimizer.step() calls so far, all ranks
  // Optimizer steps so far (ranks in lockstep, rank 0 first).
  int64_t steps() const { return calls_ / ranks_; }
  // The clip calls of step clip_step_: per rank so far; forced; not.
  int64_t clip_step_ = -1;
  std::vector<int64_t> calls_of_rank_;
  std::vector<ForcedNorm> forced_;
  int64_t unforced_ = 0;
  const double* recorded(int64_t t, int64_t r, size_t i) const {
    if (size_t(t) >= recorded_.size() ||
        size_t(r) >= recorded_[size_t(t)].size())
      return nullptr;
    const std::vector<double>& calls = recorded_[size_t(t)][size_t(r)];
    if (i >= calls.size() || !std::isfinite(calls[i])) return nullptr;
    return &calls[i];
  }
};

namespace {

// The trace's values `f` against the oracle's `v`: the cheap proxy.
error_model::Comparison judge_values(const std::string& what,
                                     const std::vector<double>& f,
                                     const std::vector<double>& v,
                                     const ParamLayout* layout, bool, double) {
  return error_model::compare_proxy(what, f, v, layout, kProxyUlps);
}

error_model::Comparison judge_values(const std::string& what,
                                     const TraceValues& f,
                                     const std::vector<double>& v,
                                     const ParamLayout* layout, bool fp64,
                                     double scale) {
  return judge_values(what, as_double(f), v, layout, fp64, scale);
}

template <class B>
error_model::Comparison judge_values(const std::string& what,
                                     const TraceValues& f,
                                     const std::vector<Tracked<B>>& v,
                                     const ParamLayout* layout, bool fp64,
                                     double scale) {
  if (!fp64) {
    return error_model::compare(what, as_float(f), v, layout,
                                error_model::tolerance("bound_slack"), scale);
  }
  return error_model::compare(what, as_double(f), v, layout,
                              error_model::tolerance("bound_slack"),
                              kFp64Scale);
}

// The trainer's recorded pre-clip norms `f` against the oracle's `v`:
// the norm of the gradient, so within the gradient's bound (scaled as the
// gradient's is: fp64, autocast).  A norm the recorder computed itself
// (an inferred clip) is a double: compared as it is.
error_model::Comparison judge_norms(const std::string& what,
                                    const std::vector<double>& f,
                                    const std::vector<double>& v,
                                    const Ctx& c) {
  return judge_values(what, f, v, nullptr, c.fp64, c.grad_scale);
}

template <class B>
error_model::Comparison judge_norms(const std::string& what,
                                    const std::vector<double>& f,
                                    const std::vector<Tracked<B>>& v,
                                    const Ctx& c) {
  return error_model::compare(what, f, v, nullptr,
                              error_model::tolerance("bound_slack"),
                              c.fp64 ? kFp64Scale : c.grad_scale);
}
}  // namespace

// Steps outside `range`: before it, the trace's gradients and parameters
// are still put in place (the optimizer's state is rebuilt from them, as
// in a whole run), nothing is judged; after it, only steps are counted.
// With assume_moments taken (`skip`), the steps before the range are
// counted only, and the range's first step starts from the trace's
// parameters and recorded moments of the step before it.
template <class T>
Forced forced_run(const Ctx& c, const Behavior& b, StepRange range,
                  bool assume_moments) {
  Oracle<T> oracle(c.s.model, c.data, c.init);
  const OptimizerSpec& o = c.s.optimizer;
  const bool stateful = o.kind != OptimizerKind::sgd || o.momentum != 0.0;
  bool skip = false;
  if constexpr (!std::is_same_v<T, double>)
    skip = assume_moments && range.begin > 0 &&
           moments_recorded(c, range.begin - 1);
  Watched<Oracle<T>> w(oracle, range, stateful, c.s.batching.ranks,
                       c.clip_norms, skip);
  TrainerOptions opt;
  opt.record_values = false;
  opt.record_events = false;
  opt.max_steps = c.s.batching.max_steps;
  opt.max_windows = c.max_windows;
  opt.forced_scale_exp = c.scale_exps;
  opt.forced_skip = c.forced_skip;
  Trainer<Watched<Oracle<T>>> trainer(w, c.s, b, c.s.optimizer.lr, opt);
  w.set_rank([&trainer] { return trainer.rank(); });
  Forced r;
  r.eval.resize(c.trace.size());
  r.assumed_moments = skip;
  const size_t n = c.trace.size();
  // With R > 1 ranks the hooks run once per rank: rank 0 is judged (the
  // trace's values are rank 0's: the all-reduced gradient and its
  // parameters); every rank is then forced to the trace's.
  // Adam's moments (c.moments): trusted[t] when step t's recorded ones
  // were found within the bound of the oracle's (judged, or before a
  // part's range checked all the same, so that a part's state is a whole
  // run's); every rank's step t + 1 then starts from them
  // (force_moments).
  std::vector<char> trusted(c.moments ? n : 0, 0);
  // The oracle's gradients or parameters set to step t's in the trace.
  auto force = [&](std::vector<T>& dst, int64_t step, bool grad) {
    const TraceStep& want = c.trace[size_t(step)];
    const TraceValues& src = grad ? want.grad : want.param;
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = lift<T>(src[i]);
  };
  auto force_state = [&](int64_t step, Watched<Oracle<T>>& e) {
    if constexpr (!std::is_same_v<T, double>)
      if (c.moments && step > 0 && trusted[size_t(step - 1)])
        force_moments<T>(c, step, e.inner().adam_moment(false),
                         e.inner().adam_moment(true));
  };
  auto before = [&](int64_t step, Watched<Oracle<T>>& e) {
    r.steps = std::max(r.steps, step + 1);
    if (size_t(step) >= n || !range.contains(step)) {
      if (size_t(step) < n && step < range.begin && stateful && !skip) {
        force_state(step, e);
        force(e.inner().grads(), step, true);
      }
      return;
    }
    force_state(step, e);
    if (trainer.rank() != 0) {  // rank 0 was judged: force the trace's
      force(e.inner().grads(), step, true);
      return;
    }
    StepEval& ev = r.eval[size_t(step)];
    ev.seen = true;
    const auto forced = e.take_forced(step, ev.unforced);
    if (!forced.empty()) {
      std::vector<double> f;
      std::vector<T> v;
      for (const auto& x : forced) {
        f.push_back(x.recorded);
        v.push_back(x.oracle);
      }
      ev.norm = judge_norms(fmt::format("step {} clip norm", step), f, v, c);
    }
    ev.grad = judge_values(fmt::format("step {} gradient", step),
                           c.trace[size_t(step)].grad, e.inner().grads(),
                           &c.layout, c.fp64, c.grad_scale);
    force(e.inner().grads(), step, true);
  };
  auto after = [&](int64_t step, Watched<Oracle<T>>& e) {
    if (size_t(step) >= n) return;
    std::vector<T>& params = e.inner().params();
    if (!range.contains(step)) {
      if (skip && step < range.begin) {
        // The state the range starts from: the trace's parameters, and
        // the recorded moments taken (trusted) as judged within the bound.
        if (step + 1 == range.begin) {
          trusted[size_t(step)] = 1;
          force(params, step, false);
        }
        return;
      }
      // Before the range: the next step's parameters are the trace's.
      if (step < range.begin) {
        if constexpr (!std::is_same_v<T, double>)
          if (c.moments && stateful && trainer.rank() == 0) {
            StepEval unreported;
            trusted[size_t(step)] =
                judge_moments<T>(c, step, e.inner().exp_avg(),
                                 e.inner().exp_avg_sq(), unreported);
          }
        force(params, step, false);
      }
      return;
    }
    if (trainer.rank() == 0) {
      if (c.progress) c.progress->step();
      StepEval& ev = r.eval[size_t(step)];
      ev.param = judge_values(fmt::format("step {} parameters", step),
                              c.trace[size_t(step)].param, params, &c.layout,
                              c.fp64, 1.0);
      if constexpr (!std::is_same_v<T, double>)
        if (c.moments)
          trusted[size_t(step)] = judge_moments<T>(c, step, e.inner().exp_avg(),
                                                   e.inner().exp_avg_sq(), ev);
    }
    force(params, step, false);
  };
  trainer.set_step_hooks(before, after);
  trainer.run(c.plan, "certify");
  r.moments_trusted_last = range.end > 0 &&
                           size_t(range.end - 1) < trusted.size() &&
                           trusted[size_t(range.end - 1)];
  return r;
}

template Forced forced_run<double>(const Ctx&, const Behavior&, StepRange,
                                   bool);
template Forced forced_run<TR>(const Ctx&, const Behavior&, StepRange, bool);
template Forced forced_run<TD>(const Ctx&, const Behavior&, StepRange, bool);

Forced judge_steps(const Ctx& c, const Behavior& b, bool rigorous) {
  // Contiguous ranges, one per thread (at least one step each): the
  // optimizer's state before a range is rebuilt by that range's run.
  const int64_t begin = c.range.begin;
  const int64_t end = c.range.end;
  const int64_t steps = end - begin;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(thread_count(c.threads)), steps));
  std::vector<StepRange> ranges;
  for (int64_t k = 0; k < parts; ++k)
    ranges.push_back(
        {begin + steps * k / parts, begin + steps * (k + 1) / parts});
  std::vector<Forced> out(ranges.size());
  auto run = [&](size_t k, bool assume_moments) {
    if (!rigorous) return forced_run<double>(c, b, ranges[k]);
    if (c.arith == BoundArith::dd)
      return forced_run<TD>(c, b, ranges[k], assume_moments);
    return forced_run<TR>(c, b, ranges[k], assume_moments);
  };
  // A range after the first takes Adam's recorded moments before it as
  // trusted (forced_run's assume_moments) instead of rebuilding them
  // from step 0: right where the previous range found them within the
  // bound, as a whole run would; elsewhere judged again without it.
  parallel_for(ranges.size(), c.threads,
               [&](size_t k) { out[k] = run(k, k > 0); });
  for (size_t k = 1; k < out.size(); ++k)
    if (out[k].assumed_moments && !out[k - 1].moments_trusted_last)
      out[k] = run(k, false);
  Forced r = std::move(out[0]);
  for (size_t k = 1; k < out.size(); ++k)
    for (int64_t t = ranges[k].begin; t < ranges[k].end; ++t)
      r.eval[size_t(t)] = std::move(out[k].eval[size_t(t)]);
  r.moments_trusted_last = out.back().moments_trusted_last;
  return r;
}

Distance distance_of(const Forced& f, size_t trace_steps) {
  Distance d;
  for (size_t t = 0; t < f.eval.size(); ++t) {
    const StepEval& ev = f.eval[t];
    if (!ev.seen) continue;
    d.value = std::max(
        {d.value, ev.norm.max_ratio, ev.grad.max_ratio, ev.param.max_ratio});
    if (d.first_out >= 0) continue;
    // In the order the trainer computed them: the norm its clip decided
    // on, the gradient, the parameters.
    if (!ev.norm.ok()) {
      d.first_out = int64_t(t);
      d.first_out_what = "clip norm";
    } else if (!ev.grad.ok() || !ev.param.ok()) {
      d.first_out = int64_t(t);
      const bool g = !ev.grad.ok();
      const auto& cmp = g ? ev.grad : ev.param;
      d.first_out_what =
          fmt::format("{} {}", g ? "gradient" : "parameters", cmp.worst.tensor);
    }
  }
  if (size_t(f.steps) != trace_steps) d.value = kInf;
  return d;
}

int64_t window_cap(const Scenario& s, size_t trace_steps) {
  if (s.batching.max_steps < 0) return -1;  // the plan itself is bounded
  const int64_t per_epoch = scenario_size(s).windows_per_epoch.value_or(0);
  const int64_t cap = 2 * (int64_t(trace_steps) + per_epoch + 1);
  return std::max<int64_t>(cap, 2 * (s.batching.max_steps + per_epoch + 1));
}

void judge_accepted(const Forced& acc, CertifyReport& r) {
  r.expected_steps = acc.steps;
  {
    CertifyCheck c;
    c.name = "step count";
    c.ok = acc.steps == r.trace_steps;
    c.message = fmt::format("trace: {} optimizer steps; {}: {}", r.trace_steps,
                            r.accepted, acc.steps);
    r.checks.push_back(c);
  }
  std::vector<int64_t> unforced;
  for (size_t t = 0; t < acc.eval.size(); ++t) {
    const StepEval& ev = acc.eval[t];
    if (!ev.seen) continue;
    if (ev.unforced > 0) unforced.push_back(int64_t(t));
    for (const auto* cmp :
         {&ev.norm, &ev.grad, &ev.param, &ev.exp_avg, &ev.exp_avg_sq}) {
      // No clip forced; moments not recorded at this step.
      if (cmp != &ev.grad && cmp != &ev.param && cmp->n == 0) continue;
      CertifyCheck c;
      c.name = cmp->what;
      c.ok = cmp->ok();
      c.message = cmp->summary();
      c.step = int64_t(t);
      c.kind = cmp == &ev.norm      ? "clip norm"
               : cmp == &ev.grad    ? "gradient"
               : cmp == &ev.param   ? "parameters"
               : cmp == &ev.exp_avg ? "exp_avg"
                                    : "exp_avg_sq";
      c.tensor_ratio =
          cmp == &ev.norm
              ? std::vector<std::pair<std::string, double>>{{"total",
                                                             cmp->max_ratio}}
              : cmp->tensor_ratio;
      r.checks.push_back(c);
    }
  }
  for (const StepEval& ev : acc.eval)
    if (ev.seen && ev.exp_avg.n > 0) {
      ++r.moment_steps;
      r.moment_worst = std::max(
          {r.moment_worst, ev.exp_avg.max_ratio, ev.exp_avg_sq.max_ratio});
    }
  if (r.moment_steps > 0) r.notes.push_back(certify_moments_note(r));
  r.unforced_steps = unforced;
  if (!unforced.empty()) r.notes.push_back(certify_unforced_note(r));
}

}  // namespace accumcheck::certify_detail
