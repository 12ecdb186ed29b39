// certify, stage 2: the forced run of one semantics against the trace, and
// the accepted semantics' checks (verify/certify_stages.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "oracle/oracle.hpp"
#include "sim/limits.hpp"
#include "sim/trainer.hpp"
#include "verify/certify_stages.hpp"
#include "verify/parallel.hpp"

namespace accumcheck::certify_detail {

namespace {

// Both from the one tolerance table (oracle/error_model.hpp), with reasons.
const double kFp64Scale = error_model::tolerance("fp64_bound_scale");
const double kProxyUlps = error_model::tolerance("certify_proxy_ulps");
constexpr double kU = error_model::kUnitRoundoff32;

// An engine that remembers every grad_norm() it returned, so that the
// clip decisions of a step can be checked for ambiguity, and that judges
// the optimizer steps of one range only: what feeds a step outside it
// (forward_backward, L2, clipping, zeroing) is skipped, and the optimizer
// steps before it run on the trace's gradients and parameters only when
// the optimizer keeps state (momentum, Adam), so that the state at the
// range's first step is bit for bit a whole run's (teacher forcing: a
// step depends on the trace, never on the oracle's earlier steps).
template <class Inner>
class Watched {
 public:
  using Real = typename Inner::Real;
  // `ranks`: every rank calls optimizer_step once per optimizer step.
  Watched(Inner& in, StepRange range, bool stateful, int64_t ranks)
      : in_(in),
        range_(range),
        stateful_(stateful),
        ranks_(std::max<int64_t>(ranks, 1)) {}
  // Whether the current micro-batches feed a judged step.
  bool live() const { return range_.contains(steps()); }
  int64_t items(const std::vector<int64_t>& ids) const {
    return in_.items(ids);
  }
  void set_epoch(int64_t epoch) { in_.set_epoch(epoch); }
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
  Real grad_norm() const {
    Real n = live() ? in_.grad_norm() : Real(0);
    norms_.push_back(n);
    return n;
  }
  void scale_grads(const Real& f) {
    if (live()) in_.scale_grads(f);
  }
  void optimizer_step(const OptimizerSpec& o, double lr) {
    const bool before = steps() < range_.begin;
    const bool after = !before && !live();
    if (!after && (live() || stateful_)) in_.optimizer_step(o, lr);
    ++calls_;
  }
  EngineState<Real> state() const { return in_.state(); }
  void set_state(const EngineState<Real>& s) { in_.set_state(s); }
  std::vector<Real>& norms() { return norms_; }
  Inner& inner() { return in_; }

 private:
  Inner& in_;
  StepRange range_;
  bool stateful_;
  int64_t ranks_;
  int64_t calls_ = 0;  // optimizer.step() calls so far, all ranks
  // Optimizer steps so far (ranks in lockstep, rank 0 first).
  int64_t steps() const { return calls_ / ranks_; }
  mutable std::vector<Real> norms_;
};

template <class T>
T lift(double x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return T::exact(decltype(T::v)(x));  // exact: x is a trace value
}

// The trace's values `f` against the oracle's `v`.
error_model::Comparison judge_values(const std::string& what,
                                     const std::vector<double>& f,
                                     const std::vector<double>& v,
                                     const ParamLayout& layout, bool, double) {
  error_model::Comparison c;
  c.what = what;
  double maxabs = 0;
  for (double x : v) maxabs = std::max(maxabs, std::fabs(x));
  for (size_t i = 0; i < f.size() && i < v.size(); ++i) {
    const double err = std::fabs(f[i] - v[i]);
    const double bound =
        kProxyUlps * kU * (std::fabs(v[i]) + std::ldexp(maxabs, -10)) + 1e-300;
    error_model::accumulate(c, &layout, int64_t(i), f[i], v[i], err, bound,
                            err / bound, err > bound);
  }
  return c;
}

template <class B>
error_model::Comparison judge_values(const std::string& what,
                                     const std::vector<double>& f,
                                     const std::vector<Tracked<B>>& v,
                                     const ParamLayout& layout, bool fp64,
                                     double scale) {
  if (!fp64) {
    const std::vector<float> f32(f.begin(), f.end());  // exact: validated
    return error_model::compare(what, f32, v, &layout,
                                error_model::tolerance("bound_slack"), scale);
  }
  return error_model::compare(
      what, f, v, &layout, error_model::tolerance("bound_slack"), kFp64Scale);
}
}  // namespace

// Steps outside `range`: before it, the trace's gradients and parameters
// are still put in place (the optimizer's state is rebuilt from them, as
// in a whole run), nothing is judged; after it, only steps are counted.
template <class T>
Forced forced_run(const Ctx& c, const Behavior& b, StepRange range) {
  Oracle<T> oracle(c.s.model, c.data, c.init);
  const OptimizerSpec& o = c.s.optimizer;
  const bool stateful = o.kind != OptimizerKind::sgd || o.momentum != 0.0;
  Watched<Oracle<T>> w(oracle, range, stateful, c.s.batching.ranks);
  TrainerOptions opt;
  opt.record_values = false;
  opt.record_events = false;
  opt.max_steps = c.s.batching.max_steps;
  opt.max_windows = c.max_windows;
  Trainer<Watched<Oracle<T>>> trainer(w, c.s, b, c.s.optimizer.lr, opt);
  Forced r;
  r.eval.resize(c.trace.size());
  const size_t n = c.trace.size();
  // With R > 1 ranks the hooks run once per rank: rank 0 is judged (the
  // trace's values are rank 0's: the all-reduced gradient and its
  // parameters); every rank is then forced to the trace's.
  auto before = [&](int64_t step, Watched<Oracle<T>>& e) {
    r.steps = std::max(r.steps, step + 1);
    std::vector<T>& norms = e.norms();
    if (size_t(step) >= n || !range.contains(step)) {
      norms.clear();
      if (size_t(step) < n && step < range.begin && stateful) {
        std::vector<T>& g = e.inner().grads();
        const std::vector<double>& want = c.trace[size_t(step)].grad;
        for (size_t i = 0; i < g.size(); ++i) g[i] = lift<T>(want[i]);
      }
      return;
    }
    if (trainer.rank() != 0) {  // rank 0 was judged: force the trace's
      std::vector<T>& g = e.inner().grads();
      const std::vector<double>& want = c.trace[size_t(step)].grad;
      for (size_t i = 0; i < g.size(); ++i) g[i] = lift<T>(want[i]);
      return;
    }
    StepEval& ev = r.eval[size_t(step)];
    ev.seen = true;
    if constexpr (!std::is_same_v<T, double>) {
      // Every norm but the last (the step record's) was a clip decision.
      if (c.s.clip.enabled)
        for (size_t i = 0; i + 1 < norms.size(); ++i) {
          const T coef = T(c.s.clip.max_norm) / (norms[i] + T(1e-6));
          using std::abs;
          auto bound = coef.e;
          if (c.fp64) bound *= decltype(bound)(kFp64Scale);
          bound *= decltype(bound)(c.grad_scale);
          if (abs(coef.v - decltype(bound)(1)) <= bound) ev.ambiguous = true;
        }
    }
    norms.clear();
    ev.grad = judge_values(fmt::format("step {} gradient", step),
                           c.trace[size_t(step)].grad, e.inner().grads(),
                           c.layout, c.fp64, c.grad_scale);
    std::vector<T>& g = e.inner().grads();
    const std::vector<double>& want = c.trace[size_t(step)].grad;
    for (size_t i = 0; i < g.size(); ++i) g[i] = lift<T>(want[i]);
  };
  auto after = [&](int64_t step, Watched<Oracle<T>>& e) {
    if (size_t(step) >= n) return;
    std::vector<T>& params = e.inner().params();
    if (!range.contains(step)) {
      // Before the range: the next step's parameters are the trace's.
      if (step < range.begin) {
        const std::vector<double>& want = c.trace[size_t(step)].param;
        for (size_t i = 0; i < params.size(); ++i) params[i] = lift<T>(want[i]);
      }
      return;
    }
    if (trainer.rank() == 0) {
      StepEval& ev = r.eval[size_t(step)];
      ev.param = judge_values(fmt::format("step {} parameters", step),
                              c.trace[size_t(step)].param, params, c.layout,
                              c.fp64, 1.0);
    }
    const std::vector<double>& want = c.trace[size_t(step)].param;
    for (size_t i = 0; i < params.size(); ++i) params[i] = lift<T>(want[i]);
  };
  trainer.set_step_hooks(before, after);
  trainer.run(c.plan, "certify");
  return r;
}

template Forced forced_run<double>(const Ctx&, const Behavior&, StepRange);
template Forced forced_run<TR>(const Ctx&, const Behavior&, StepRange);
template Forced forced_run<TD>(const Ctx&, const Behavior&, StepRange);

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
  parallel_for(ranges.size(), c.threads, [&](size_t k) {
    if (!rigorous)
      out[k] = forced_run<double>(c, b, ranges[k]);
    else if (c.arith == BoundArith::dd)
      out[k] = forced_run<TD>(c, b, ranges[k]);
    else
      out[k] = forced_run<TR>(c, b, ranges[k]);
  });
  Forced r = std::move(out[0]);
  for (size_t k = 1; k < out.size(); ++k)
    for (int64_t t = ranges[k].begin; t < ranges[k].end; ++t)
      r.eval[size_t(t)] = std::move(out[k].eval[size_t(t)]);
  return r;
}

Distance distance_of(const Forced& f, size_t trace_steps) {
  Distance d;
  for (size_t t = 0; t < f.eval.size(); ++t) {
    const StepEval& ev = f.eval[t];
    if (!ev.seen) continue;
    const double worst = std::max(ev.grad.max_ratio, ev.param.max_ratio);
    const bool out = !ev.grad.ok() || !ev.param.ok();
    if (out && ev.ambiguous) continue;
    d.value = std::max(d.value, worst);
    if (out && d.first_out < 0) {
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
  for (size_t t = 0; t < acc.eval.size(); ++t) {
    const StepEval& ev = acc.eval[t];
    if (!ev.seen) continue;
    if (ev.ambiguous && (!ev.grad.ok() || !ev.param.ok()))
      r.ambiguous_steps.push_back(int64_t(t));
    for (const auto* cmp : {&ev.grad, &ev.param}) {
      CertifyCheck c;
      c.name = cmp->what;
      c.ok = cmp->ok() || ev.ambiguous;
      c.ambiguous = ev.ambiguous && !cmp->ok();
      c.message = cmp->summary();
      c.step = int64_t(t);
      c.kind = cmp == &ev.grad ? "gradient" : "parameters";
      c.tensor_ratio = cmp->tensor_ratio;
      if (c.ambiguous)
        c.message.append(
            " [ambiguous: a clip decision lies within the bound of the "
            "threshold]");
      r.checks.push_back(c);
    }
  }
}

}  // namespace accumcheck::certify_detail
