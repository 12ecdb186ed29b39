// Certification of an outside trainer's trace (verify/certify.hpp).
#include "verify/certify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <map>

#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle/real.hpp"
#include "sim/data.hpp"
#include "sim/errors.hpp"
#include "sim/layout.hpp"
#include "sim/plan.hpp"
#include "sim/trainer.hpp"
#include "verify/export.hpp"
#include "verify/null_engine.hpp"
#include "verify/trace.hpp"

namespace accumcheck {

namespace {

using TR = Tracked<BoundReal>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kU = error_model::kUnitRoundoff32;
// Both from the one tolerance table (oracle/error_model.hpp), with reasons.
const double kFp64Scale = error_model::tolerance("fp64_bound_scale");
const double kProxyUlps = error_model::tolerance("certify_proxy_ulps");

// An engine that remembers every grad_norm() it returned, so that the
// clip decisions of a step can be checked for ambiguity.
template <class Inner>
class Watched {
 public:
  using Real = typename Inner::Real;
  explicit Watched(Inner& in) : in_(in) {}
  int64_t items(const std::vector<int64_t>& ids) const {
    return in_.items(ids);
  }
  void set_epoch(int64_t epoch) { in_.set_epoch(epoch); }
  void zero_grad() { in_.zero_grad(); }
  Real forward_backward(const std::vector<int64_t>& ids, LossWeight w) {
    return in_.forward_backward(ids, w);
  }
  void add_l2(double lambda, int64_t den) { in_.add_l2(lambda, den); }
  Real grad_norm() const {
    Real n = in_.grad_norm();
    norms_.push_back(n);
    return n;
  }
  void scale_grads(const Real& f) { in_.scale_grads(f); }
  void optimizer_step(const OptimizerSpec& o, double lr) {
    in_.optimizer_step(o, lr);
  }
  EngineState<Real> state() const { return in_.state(); }
  void set_state(const EngineState<Real>& s) { in_.set_state(s); }
  std::vector<Real>& norms() { return norms_; }
  Inner& inner() { return in_; }

 private:
  Inner& in_;
  mutable std::vector<Real> norms_;
};

template <class T>
T lift(double x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return T::exact(OracleReal(x));
}

template <class T>
std::vector<T> lift_all(const std::vector<double>& x) {
  std::vector<T> r;
  r.reserve(x.size());
  for (double v : x) r.push_back(lift<T>(v));
  return r;
}

// The trace's values `f` against the oracle's `v`.
error_model::Comparison judge_values(const std::string& what,
                                     const std::vector<double>& f,
                                     const std::vector<double>& v,
                                     const ParamLayout& layout, bool) {
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

error_model::Comparison judge_values(const std::string& what,
                                     const std::vector<double>& f,
                                     const std::vector<TR>& v,
                                     const ParamLayout& layout, bool fp64) {
  if (!fp64) {
    const std::vector<float> f32(f.begin(), f.end());  // exact: validated
    return error_model::compare(what, f32, v, &layout);
  }
  return error_model::compare(
      what, f, v, &layout, error_model::tolerance("bound_slack"), kFp64Scale);
}

struct StepEval {
  bool seen = false;
  bool ambiguous = false;
  error_model::Comparison grad, param;
};

struct Forced {
  int64_t steps = 0;
  std::vector<StepEval> eval;
};

// Context shared by every forced run.
struct Ctx {
  const Scenario& s;
  const Dataset& data;
  const std::vector<float>& init;
  const Plan& plan;
  const ParamLayout& layout;
  const std::vector<TraceStep>& trace;
  bool fp64;
};

template <class T>
Forced forced_run(const Ctx& c, const Behavior& b) {
  Oracle<T> oracle(c.s.model, c.data, c.init);
  Watched<Oracle<T>> w(oracle);
  TrainerOptions opt;
  opt.record_values = false;
  opt.record_events = false;
  opt.max_steps = c.s.batching.max_steps;
  Trainer<Watched<Oracle<T>>> trainer(w, c.s, b, c.s.optimizer.lr, opt);
  Forced r;
  r.eval.resize(c.trace.size());
  const size_t n = c.trace.size();
  auto before = [&](int64_t step, Watched<Oracle<T>>& e) {
    r.steps = std::max(r.steps, step + 1);
    std::vector<T>& norms = e.norms();
    if (size_t(step) >= n) {
      norms.clear();
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
          if (abs(coef.v - decltype(bound)(1)) <= bound) ev.ambiguous = true;
        }
    }
    norms.clear();
    ev.grad = judge_values(fmt::format("step {} gradient", step),
                           c.trace[size_t(step)].grad, e.inner().grads(),
                           c.layout, c.fp64);
    EngineState<T> st = e.state();
    st.grads = lift_all<T>(c.trace[size_t(step)].grad);
    e.set_state(st);
  };
  auto after = [&](int64_t step, Watched<Oracle<T>>& e) {
    if (size_t(step) >= n) return;
    StepEval& ev = r.eval[size_t(step)];
    std::vector<T>& params = e.inner().params();
    ev.param =
        judge_values(fmt::format("step {} parameters", step),
                     c.trace[size_t(step)].param, params, c.layout, c.fp64);
    const std::vector<double>& want = c.trace[size_t(step)].param;
    for (size_t i = 0; i < params.size(); ++i) params[i] = lift<T>(want[i]);
  };
  trainer.set_step_hooks(before, after);
  trainer.run(c.plan, "certify");
  return r;
}

struct Distance {
  double value = 0;
  int64_t first_out = -1;
  std::string first_out_what;
};

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

// ------------------------------------------------------- call patterns

// Per optimizer step: forward_backward, zero_grad, clip, optimizer_step,
// scheduler_step calls.  zero_grads before the first backward or after
// the last, and repeated zero_grads with nothing between them, are no-ops
// and not counted (beyond the first of a repeat).  With R > 1 ranks the
// pattern is rank 0's calls and the collectives (all_reduce): ranks run
// in lockstep, and a rank that does not is seen in its parameters.
using Counts = std::array<int64_t, 6>;
using Pattern = std::vector<Counts>;

size_t kind_slot(EventKind k) {
  switch (k) {
    case EventKind::forward_backward:
      return 0;
    case EventKind::zero_grad:
      return 1;
    case EventKind::clip:
      return 2;
    case EventKind::optimizer_step:
      return 3;
    case EventKind::scheduler_step:
      return 4;
    case EventKind::all_reduce:
      return 5;
  }
  return 0;
}
constexpr std::string_view kSlotNames[] = {"backward",       "zero_grad",
                                           "clip",           "optimizer.step",
                                           "scheduler.step", "all_reduce"};

Pattern pattern_of(const std::vector<Event>& all_events,
                   bool ignore_scheduler) {
  std::vector<Event> events;
  for (const Event& e : all_events)
    if (e.rank <= 0) events.push_back(e);
  Pattern p;
  bool seen_fb = false, last_zero = false;
  // zero_grads after the last backward change nothing either.
  size_t last_fb = 0;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == EventKind::forward_backward) last_fb = i;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == EventKind::zero_grad && i > last_fb) continue;
    if (e.kind == EventKind::zero_grad) {
      if (!seen_fb || last_zero) continue;
      last_zero = true;
    } else {
      last_zero = false;
    }
    if (e.kind == EventKind::forward_backward) seen_fb = true;
    if (ignore_scheduler && e.kind == EventKind::scheduler_step) continue;
    if (p.size() <= size_t(e.step)) p.resize(size_t(e.step) + 1, Counts{});
    ++p[size_t(e.step)][kind_slot(e.kind)];
  }
  return p;
}

std::string counts_text(const Pattern& p, size_t step) {
  const Counts c = step < p.size() ? p[step] : Counts{};
  std::string s;
  for (size_t k = 0; k < c.size(); ++k) {
    if (k == 5 && c[k] == 0) continue;  // all_reduce: ranks only
    if (!s.empty()) s.append(", ");
    s.append(fmt::format("{} {}", c[k], kSlotNames[k]));
  }
  return s;
}

Pattern semantics_pattern(const Scenario& s, const Plan& plan,
                          const Behavior& b, bool ignore_scheduler) {
  NullEngine null;
  TrainerOptions opt;
  opt.record_values = false;
  opt.max_steps = s.batching.max_steps;
  Trainer<NullEngine> t(null, s, b, s.optimizer.lr, opt);
  return pattern_of(t.run(plan, "pattern").events, ignore_scheduler);
}

std::string ratio_text(double r) {
  if (std::isinf(r)) return "inf";
  return fmt::format("{:.3g}", r);
}

std::string xml_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o.append("&lt;");
        break;
      case '>':
        o.append("&gt;");
        break;
      case '&':
        o.append("&amp;");
        break;
      case '"':
        o.append("&quot;");
        break;
      default:
        o.push_back(c);
    }
  }
  return o;
}

// ------------------------------------------------------ trace validation

struct LoadedTrace {
  Trace trace;
  const TraceRun* run = nullptr;
  std::vector<TraceStep> steps;
};

LoadedTrace load(const Scenario& s, const std::string& dir,
                 const CertifyConfig& cfg, const ParamLayout& layout) {
  LoadedTrace L;
  L.trace = read_trace(dir);
  const Trace& t = L.trace;
  const std::string digest = t.meta_value("scenario_digest");
  if (digest != s.digest) {
    int64_t line = 0;
    for (size_t i = 0; i < t.meta.size(); ++i)
      if (t.meta[i].first == "scenario_digest") line = int64_t(i) + 2;
    throw InputError(t.meta_path(), line, 0, "scenario_digest",
                     fmt::format("the trace was made for scenario digest "
                                 "'{}', but {} has digest {} (re-export the "
                                 "bundle and retrain, or certify against the "
                                 "scenario file the bundle holds)",
                                 digest, s.path, s.digest));
  }
  if (t.runs.empty())
    throw InputError(t.values_path(), 0, 0, "run",
                     "the trace holds no run (no events or values rows)");
  if (!cfg.run.empty()) {
    L.run = t.run(cfg.run);
    if (!L.run) {
      std::string names;
      for (const TraceRun& r : t.runs) {
        if (!names.empty()) names.append(", ");
        names.append(r.name);
      }
      throw InputError(
          t.values_path(), 0, 0, "run",
          fmt::format("no run '{}' in the trace; it holds {}", cfg.run, names));
    }
  } else {
    L.run = &t.runs.back();
  }
  const TraceRun& run = *L.run;
  for (const TraceValue& v : run.values) {
    if (std::isnan(v.value))
      throw InputError(t.values_path(), v.line, 0, "value",
                       "expected a number, got an empty field (NaN)");
    if (!std::isfinite(v.value))
      throw InputError(
          t.values_path(), v.line, 0, "value",
          fmt::format("expected a finite number, got {}", v.value));
    if (!cfg.fp64 && double(float(v.value)) != v.value)
      throw InputError(
          t.values_path(), v.line, 0, "value",
          fmt::format("{} is not a float32 value; a float64 trainer is "
                      "certified with --precision fp64",
                      v.value));
  }
  L.steps = gather_steps(t, run, layout);
  for (size_t i = 0; i < L.steps.size(); ++i) {
    const TraceStep& st = L.steps[i];
    auto line_of = [&](int64_t step) {
      for (const TraceValue& v : run.values)
        if (v.step == step) return v.line;
      return int64_t(0);
    };
    if (st.step != int64_t(i))
      throw InputError(
          t.values_path(), line_of(st.step), 0, "step",
          fmt::format("run '{}': step {} follows step {}; "
                      "steps must be 0, 1, 2, ... without gaps",
                      run.name, st.step, i == 0 ? -1 : L.steps[i - 1].step));
    if (st.grad.empty() || st.param.empty())
      throw InputError(
          t.values_path(), line_of(st.step), 0,
          st.grad.empty() ? "grad" : "param",
          fmt::format("run '{}' step {} has no {} values; each "
                      "step needs its gradient and parameters",
                      run.name, st.step, st.grad.empty() ? "grad" : "param"));
  }
  return L;
}

}  // namespace

CertifyReport certify(const Scenario& s, const std::string& trace_dir,
                      const CertifyConfig& cfg) {
  require_exportable_model(s);
  const auto t0 = std::chrono::steady_clock::now();
  const ParamLayout layout = layout_of(s.model);
  const LoadedTrace L = load(s, trace_dir, cfg, layout);
  const Dataset data = make_dataset(s);
  const std::vector<float> init = initial_parameters(s, layout);
  const Plan plan = make_plan(s);
  const Ctx ctx{s, data, init, plan, layout, L.steps, cfg.fp64};

  CertifyReport r;
  r.scenario = s.name;
  r.run = L.run->name;
  r.engine = L.trace.meta_value("engine");
  r.precision = L.trace.meta_value("precision");
  r.accepted = semantics_name(s.trainer.accepted);
  r.trace_steps = int64_t(L.steps.size());

  // The accepted semantics, with the rigorous bound.
  const Behavior accepted_b = behavior_of(s.trainer.accepted);
  // The accepted semantics under the Tracked bound runs on a thread of its
  // own while every candidate is ranked cheaply here.
  auto acc_future = std::async(std::launch::async,
                               [&] { return forced_run<TR>(ctx, accepted_b); });
  std::vector<Behavior> behaviors;
  {
    // Diagnosis: every single pitfall and pair, deduplicated by behaviour.
    // The mean-of-means pitfall of the scenario's loss: sample- for sample
    // losses, token- for token losses (the same switch, named for the
    // loss; the scenario parser refuses the other).
    std::vector<Pitfall> catalog;
    for (Pitfall p : kAllPitfalls)
      if (p != (s.model.kind == ModelKind::token
                    ? Pitfall::sample_mean_of_means
                    : Pitfall::token_mean_of_means))
        catalog.push_back(p);
    std::vector<std::vector<Pitfall>> sems = {{}};
    for (Pitfall p : catalog) sems.push_back({p});
    for (size_t i = 0; i < catalog.size(); ++i)
      for (size_t j = i + 1; j < catalog.size(); ++j)
        sems.push_back({catalog[i], catalog[j]});
    sems.push_back(s.trainer.accepted);
    // Per candidate: every step's cheap gradient and parameter ratios.
    std::vector<std::vector<double>> fingerprints;
    for (const auto& sem : sems) {
      const Behavior b = behavior_of(sem);
      const std::string name = semantics_name(sem);
      auto it = std::find(behaviors.begin(), behaviors.end(), b);
      if (it != behaviors.end()) {
        auto& cand = r.ranking[size_t(it - behaviors.begin())];
        if (cand.name != name &&
            std::find(cand.aliases.begin(), cand.aliases.end(), name) ==
                cand.aliases.end())
          cand.aliases.push_back(name);
        continue;
      }
      behaviors.push_back(b);
      CertifyCandidate c;
      c.name = name;
      c.pitfalls = sem;
      // Cheap pass: double oracle, proxy bound.
      const Forced f = forced_run<double>(ctx, b);
      fingerprints.emplace_back();
      c.steps = f.steps;
      c.proxy = distance_of(f, L.steps.size()).value;
      for (const StepEval& ev : f.eval) {
        fingerprints.back().push_back(ev.grad.max_ratio);
        fingerprints.back().push_back(ev.param.max_ratio);
      }
      r.ranking.push_back(c);
    }
    // Fold a candidate into a simpler one (a strict subset of its
    // pitfalls) that gave bitwise the same cheap result: the extra
    // pitfalls are inert on this scenario.
    {
      auto subset = [](const std::vector<Pitfall>& a,
                       const std::vector<Pitfall>& b) {
        if (a.size() >= b.size()) return false;
        for (Pitfall p : a)
          if (std::find(b.begin(), b.end(), p) == b.end()) return false;
        return true;
      };
      std::vector<CertifyCandidate> kept;
      std::vector<Behavior> kept_b;
      std::vector<size_t> kept_i;
      for (size_t i = 0; i < r.ranking.size(); ++i) {
        CertifyCandidate& x = r.ranking[i];
        const bool is_acc = behaviors[i] == accepted_b;
        CertifyCandidate* into = nullptr;
        for (size_t k = 0; k < kept.size(); ++k)
          if (!is_acc && subset(kept[k].pitfalls, x.pitfalls) &&
              fingerprints[kept_i[k]] == fingerprints[i] &&
              kept[k].steps == x.steps) {
            into = &kept[k];
            break;
          }
        if (!into) {
          kept.push_back(x);
          kept_b.push_back(behaviors[i]);
          kept_i.push_back(i);
          continue;
        }
        std::string extra;
        for (Pitfall p : x.pitfalls)
          if (std::find(into->pitfalls.begin(), into->pitfalls.end(), p) ==
              into->pitfalls.end()) {
            if (!extra.empty()) extra.append("+");
            extra.append(pitfall_id(p));
          }
        if (std::find(into->inert.begin(), into->inert.end(), extra) ==
            into->inert.end())
          into->inert.push_back(extra);
      }
      r.ranking = std::move(kept);
      behaviors = std::move(kept_b);
    }
  }
  // The closest few candidates are judged with the Tracked bound too, in
  // parallel: plausible matches only (within 10x of the best cheap
  // distance, or of the bound), at most cfg.refine of them.  When the
  // accepted semantics already looks out of the bound on the cheap pass,
  // they start now, beside the accepted semantics' rigorous run, rather
  // than after it.
  std::vector<std::pair<size_t, std::future<Forced>>> jobs;
  bool refine_launched = false;
  auto launch_refine = [&] {
    refine_launched = true;
    std::vector<size_t> order(r.ranking.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return r.ranking[a].proxy < r.ranking[b].proxy;
    });
    const double plausible =
        10 * std::max(1.0, order.empty() ? 1.0 : r.ranking[order[0]].proxy);
    const double best_proxy = order.empty() ? 0.0 : r.ranking[order[0]].proxy;
    for (size_t k = 0; k < order.size(); ++k) {
      const CertifyCandidate& c = r.ranking[order[k]];
      const Behavior& b = behaviors[order[k]];
      if (b == accepted_b) continue;
      // Candidates tied with the best cheap distance are always judged
      // rigorously, so a tie is reported as a tie.
      const bool tied = c.proxy == best_proxy;
      if (!tied && (int(jobs.size()) >= cfg.refine || !(c.proxy <= plausible)))
        continue;
      jobs.emplace_back(order[k], std::async(std::launch::async, [&ctx, b] {
                          return forced_run<TR>(ctx, b);
                        }));
    }
  };
  for (size_t k = 0; k < r.ranking.size(); ++k)
    if (behaviors[k] == accepted_b && r.ranking[k].proxy > 1) launch_refine();
  const Forced acc = acc_future.get();
  r.expected_steps = acc.steps;
  const Distance acc_d = distance_of(acc, L.steps.size());
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
      if (c.ambiguous)
        c.message.append(
            " [ambiguous: a clip decision lies within the bound of the "
            "threshold]");
      r.checks.push_back(c);
    }
  }
  // Call pattern (when the trace has events).
  r.pattern_checked = !L.run->events.empty();
  Pattern trace_pattern;
  bool ignore_sched = false;
  if (r.pattern_checked) {
    std::vector<Event> evs;
    bool any_sched = false;
    for (const TraceEvent& e : L.run->events) {
      evs.push_back(e.event);
      any_sched = any_sched || e.event.kind == EventKind::scheduler_step;
    }
    // A constant schedule needs no scheduler object at all.
    ignore_sched = !any_sched && s.schedule.kind == ScheduleKind::constant;
    trace_pattern = pattern_of(evs, ignore_sched);
    const Pattern want = semantics_pattern(s, plan, accepted_b, ignore_sched);
    r.pattern_ok = trace_pattern == want;
    if (r.pattern_ok) {
      r.pattern_message =
          fmt::format("call pattern as {} (optimizer step 1: {})", r.accepted,
                      counts_text(want, std::min<size_t>(1, want.size() - 1)));
    } else {
      size_t at = 0;
      while (at < std::max(want.size(), trace_pattern.size()) &&
             at < want.size() && at < trace_pattern.size() &&
             want[at] == trace_pattern[at])
        ++at;
      r.pattern_message = fmt::format(
          "call pattern differs from {} at optimizer step {}: the trace has "
          "{}; {} has {}",
          r.accepted, at, counts_text(trace_pattern, at), r.accepted,
          counts_text(want, at));
    }
    CertifyCheck c;
    c.name = "call pattern";
    c.ok = r.pattern_ok;
    c.message = r.pattern_message;
    r.checks.push_back(c);
  }

  r.pass = std::all_of(r.checks.begin(), r.checks.end(),
                       [](const CertifyCheck& c) { return c.ok; });

  if (r.pass) {
    double worst = 0;
    for (const StepEval& ev : acc.eval)
      if (ev.seen && !ev.ambiguous)
        worst = std::max({worst, ev.grad.max_ratio, ev.param.max_ratio});
    r.verdict = fmt::format(
        "PASS: {} steps within the bound of {} (max error {} of bound){}",
        r.trace_steps, r.accepted, ratio_text(worst),
        r.ambiguous_steps.empty() ? std::string()
                                  : fmt::format("; {} ambiguous clip step(s)",
                                                r.ambiguous_steps.size()));
  } else {
    std::string why;
    if (acc.steps != r.trace_steps)
      why = fmt::format("the trace has {} optimizer steps, {} takes {}",
                        r.trace_steps, r.accepted, acc.steps);
    else if (acc_d.first_out >= 0)
      why = fmt::format("{} leaves the bound at step {} ({})", r.accepted,
                        acc_d.first_out, acc_d.first_out_what);
    else
      why = r.pattern_message;
    r.verdict = fmt::format("FAIL: {}", why);

    if (r.pattern_checked)
      for (size_t i = 0; i < r.ranking.size(); ++i)
        r.ranking[i].pattern_matches =
            semantics_pattern(s, plan, behaviors[i], ignore_sched) ==
            trace_pattern;
    // Rigorous pass for the accepted semantics and the closest few.
    if (!refine_launched) launch_refine();
    for (size_t k = 0; k < r.ranking.size(); ++k)
      if (behaviors[k] == accepted_b) {
        CertifyCandidate& c = r.ranking[k];
        const Distance d = distance_of(acc, L.steps.size());
        c.tracked = true;
        c.distance = d.value;
        c.first_out = d.first_out;
        c.first_out_what = d.first_out_what;
      }
    for (auto& [i, job] : jobs) {
      const Distance d = distance_of(job.get(), L.steps.size());
      CertifyCandidate& c = r.ranking[i];
      c.tracked = true;
      c.distance = d.value;
      c.first_out = d.first_out;
      c.first_out_what = d.first_out_what;
    }
    for (CertifyCandidate& c : r.ranking)
      if (!c.tracked) c.distance = c.proxy;
    std::stable_sort(r.ranking.begin(), r.ranking.end(),
                     [](const CertifyCandidate& a, const CertifyCandidate& b) {
                       return a.distance < b.distance;
                     });

    // The diagnosis lines.
    const CertifyCandidate& best = r.ranking.front();
    auto full_name = [](const CertifyCandidate& c) {
      std::string n = c.name;
      for (const std::string& a : c.aliases) n.append(" = ").append(a);
      return n;
    };
    auto inert_text = [](const CertifyCandidate& c) {
      std::string n;
      for (const std::string& a : c.inert) {
        n.append(n.empty() ? "" : ", ").append(a);
      }
      return n.empty() ? n
                       : fmt::format(" (inert here, so equally close: +{})", n);
    };
    std::vector<const CertifyCandidate*> ties;
    for (const CertifyCandidate& c : r.ranking)
      if (c.tracked && (c.distance == best.distance ||
                        (c.distance <= 1 && best.distance <= 1)))
        ties.push_back(&c);
    std::string d;
    if (best.distance <= 1) {
      if (ties.size() > 1) {
        d = "matches, tied (all within the bound): ";
        for (size_t i = 0; i < ties.size(); ++i) {
          if (i) d.append(" | ");
          d.append(fmt::format("{} (max error {} of bound)",
                               full_name(*ties[i]),
                               ratio_text(ties[i]->distance)));
        }
      } else {
        d = fmt::format("matches {} (max error {} of bound){}", full_name(best),
                        ratio_text(best.distance), inert_text(best));
      }
    } else {
      d = fmt::format(
          "no candidate stays within the bound; closest: {} (max error {} of "
          "bound{})",
          full_name(best), ratio_text(best.distance),
          best.first_out >= 0
              ? fmt::format(", first leaves it at step {}", best.first_out)
              : std::string());
    }
    if (acc_d.first_out >= 0)
      d.append(fmt::format("; {} leaves the bound at step {} ({})", r.accepted,
                           acc_d.first_out, acc_d.first_out_what));
    else if (acc.steps != r.trace_steps)
      d.append(fmt::format("; {} takes {} steps, the trace {}", r.accepted,
                           acc.steps, r.trace_steps));
    // Margin: the runner-up that is not tied.
    for (const CertifyCandidate& c : r.ranking)
      if (std::find(ties.begin(), ties.end(), &c) == ties.end() &&
          &c != &best) {
        d.append(fmt::format("\nmargin: next is {} at {} of bound{}", c.name,
                             ratio_text(c.distance),
                             c.tracked ? "" : " (cheap proxy bound)"));
        if (best.distance > 0 && std::isfinite(c.distance))
          d.append(fmt::format(" ({}x the best)",
                               ratio_text(c.distance / best.distance)));
        break;
      }
    if (r.pattern_checked) {
      d.append("\n").append(r.pattern_message);
      if (!r.pattern_ok) {
        std::string m;
        for (const CertifyCandidate& c : r.ranking)
          if (c.pattern_matches) {
            if (!m.empty()) m.append(", ");
            m.append(c.name);
          }
        d.append(fmt::format("; the trace's call pattern is that of: {}",
                             m.empty() ? std::string("no candidate") : m));
      }
    }
    r.diagnosis = d;
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

std::string certify_text(const CertifyReport& r, int top) {
  std::string o = fmt::format(
      "certify {}: run '{}' ({}, {}), {} optimizer steps; accepted semantics "
      "{} takes {}\n",
      r.scenario, r.run, r.engine, r.precision, r.trace_steps, r.accepted,
      r.expected_steps);
  o.append(r.verdict).append("\n");
  for (int64_t s : r.ambiguous_steps)
    o.append(fmt::format(
        "ambiguous: step {}: a clip decision lies within the bound of the "
        "threshold; the step is reported, not failed\n",
        s));
  if (r.pass) {
    if (r.pattern_checked) o.append(r.pattern_message).append("\n");
    return o;
  }
  for (const CertifyCheck& c : r.checks)
    if (!c.ok) {
      o.append("first failing check: ").append(c.message).append("\n");
      break;
    }
  o.append("diagnosis: ").append(r.diagnosis).append("\n");
  o.append(
      "ranking (distance = max over steps of error/bound; * = rigorous "
      "Tracked bound, else the cheap proxy):\n");
  for (size_t i = 0; i < r.ranking.size() && int(i) < top; ++i) {
    const CertifyCandidate& c = r.ranking[i];
    std::string name = c.name;
    for (const std::string& a : c.aliases) name.append(" = ").append(a);
    if (!c.inert.empty()) {
      // Single pitfalls that change nothing here are named; pairs of
      // them are only counted (they would bury the ranking).
      name.append("  [+ inert here:");
      size_t pairs = 0;
      for (const std::string& a : c.inert) {
        if (a.find('+') != std::string::npos) {
          ++pairs;
          continue;
        }
        name.append(" ").append(a);
      }
      if (pairs) name.append(fmt::format(" and {} pairs of them", pairs));
      name.append("]");
    }
    o.append(fmt::format("  {:2}. {:<10}{} {}{}\n", i + 1,
                         ratio_text(c.distance), c.tracked ? "*" : " ", name,
                         std::isinf(c.distance)
                             ? fmt::format(" ({} steps)", c.steps)
                             : std::string()));
  }
  return o;
}

std::string certify_junit(const CertifyReport& r) {
  int64_t failures = 0;
  for (const CertifyCheck& c : r.checks) failures += c.ok ? 0 : 1;
  std::string o = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o.append(fmt::format(
      "<testsuites>\n<testsuite name=\"accumcheck certify {}\" tests=\"{}\" "
      "failures=\"{}\" errors=\"0\" time=\"{:.3f}\">\n",
      xml_escape(r.scenario), r.checks.size(), failures, r.seconds));
  const std::string cls = xml_escape("accumcheck.certify." + r.scenario);
  for (const CertifyCheck& c : r.checks) {
    o.append(fmt::format("  <testcase classname=\"{}\" name=\"{}\"", cls,
                         xml_escape(c.name)));
    if (c.ok && !c.ambiguous) {
      o.append("/>\n");
      continue;
    }
    o.append(">\n");
    if (!c.ok)
      o.append(fmt::format(
          "    <failure message=\"{}\">{}</failure>\n", xml_escape(c.message),
          xml_escape(r.diagnosis.empty() ? c.message : r.diagnosis)));
    else
      o.append(fmt::format("    <system-out>{}</system-out>\n",
                           xml_escape(c.message)));
    o.append("  </testcase>\n");
  }
  o.append("</testsuite>\n</testsuites>\n");
  return o;
}

}  // namespace accumcheck
