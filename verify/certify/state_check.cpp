// certify's state checks (verify/certify/state_check.hpp).
#include "verify/certify/state_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "oracle/oracle.hpp"
#include "sim/errors.hpp"
#include "sim/pitfalls.hpp"
#include "verify/certify/parallel.hpp"

namespace accumcheck::certify_detail {

namespace {

// "<catalog id>: <what>".
std::string finding(Pitfall p, const std::string& what) {
  return fmt::format("{}: {}", pitfall_id(p), what);
}

// The backward passes of the trace (forward_backward events, in order):
// the optimizer steps before each and its sample ids, and the events
// between two backward passes (scheduler and optimizer calls).
struct Backward {
  int64_t step = 0;
  std::vector<int64_t> ids;
};

struct Walk {
  std::vector<Backward> backward;
  // gap[b]: scheduler_step and optimizer_step calls after backward b - 1
  // and before backward b (b = backward.size(): after the last).
  std::vector<std::pair<int64_t, int64_t>> gap;
};

Walk walk(const TraceRun& run) {
  Walk w;
  w.gap.emplace_back(0, 0);
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.rank > 0) continue;
    if (e.kind == EventKind::forward_backward) {
      w.backward.push_back({e.step, e.sample_ids});
      w.gap.emplace_back(0, 0);
    } else if (e.kind == EventKind::scheduler_step) {
      ++w.gap.back().first;
    } else if (e.kind == EventKind::optimizer_step) {
      ++w.gap.back().second;
    }
  }
  return w;
}

// Rows of one kind by step, then tensor, in the layout's flat order.
using ByStep = std::map<int64_t, TraceValues>;

// Takes (moves) the kind's values.bin blocks out of st.blocks, then sets
// the kind's state.csv rows over them.
ByStep gather(StateSection& st, std::string_view kind,
              const ParamLayout& layout) {
  ByStep out;
  if (const auto b = st.blocks.find(kind); b != st.blocks.end()) {
    out = std::move(b->second);
    st.blocks.erase(b);
  }
  std::map<std::string, const TensorView*, std::less<>> tensors;
  for (const TensorView& v : layout.tensors) tensors[v.name] = &v;
  for (const TensorView& v : layout.buffers) tensors[v.name] = &v;
  std::map<int64_t, std::vector<double>> rows;  // steps state.csv sets
  for (const StateValue& v : st.rows) {
    if (v.kind != kind) continue;
    const auto it = tensors.find(v.tensor);
    if (it == tensors.end() || v.index >= it->second->size())
      throw InputError(st.path, v.line, 0, "tensor",
                       fmt::format("{} {}[{}]: not a tensor element of this "
                                   "scenario's model",
                                   kind, v.tensor, v.index));
    const bool buffer = kind == "running_mean" || kind == "running_var";
    std::vector<double>& dst = rows[v.step];
    if (dst.empty()) {
      const auto block = out.find(v.step);
      dst =
          block != out.end()
              ? block->second.vector()
              : std::vector<double>(
                    size_t(buffer ? layout.buffer_total : layout.total), kNaN);
    }
    dst[size_t(it->second->offset + v.index)] = v.value;
  }
  for (auto& [step, values] : rows) out[step] = TraceValues(std::move(values));
  return out;
}

template <class Values>  // TraceValues or std::vector<double>
bool complete(const Values& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isnan(v[i])) return false;
  return true;
}

// The trace's parameters before step t (after step t - 1, or the
// initial ones).
std::vector<double> params_before(const Ctx& c, int64_t t) {
  if (t == 0) return {c.init.begin(), c.init.end()};
  return c.trace[size_t(t - 1)].param.vector();
}

void add(CertifyReport& r, std::string name, bool ok, std::string message,
         bool separate = false) {
  CertifyCheck k;
  k.name = std::move(name);
  k.ok = ok;
  k.message = std::move(message);
  k.separate = separate;
  r.checks.push_back(std::move(k));
}

// "; WHAT: max error X of the bound", or "; BAD" when a replay failed.
std::string replay_text(const std::string& bad, std::string_view what,
                        double worst) {
  if (!bad.empty()) return "; " + bad;
  return fmt::format("; {}: max error {:.3g} of the bound", what, worst);
}

// ---- loss scale and skipped steps

void loss_scale(const StateSection& st, const Walk& w, CertifyReport& r,
                std::vector<std::string>& findings) {
  std::vector<int64_t> skips;  // backward counts at each skip
  for (const StateValue& v : st.rows)
    if (v.kind == "skipped") skips.push_back(v.index);
  // The window of backward b: its step and the skips before it.
  auto window_of = [&](int64_t b, int64_t step) {
    const int64_t before = int64_t(std::count_if(
        skips.begin(), skips.end(), [&](int64_t s) { return s <= b; }));
    return std::pair{step, before};
  };
  std::map<std::pair<int64_t, int64_t>, std::pair<double, int64_t>> first;
  int64_t scales = 0;
  std::string bad;
  for (const StateValue& v : st.rows) {
    if (v.kind != "loss_scale") continue;
    ++scales;
    const auto key = window_of(v.index, v.step);
    const auto [it, fresh] = first.emplace(key, std::pair{v.value, v.index});
    if (!fresh && it->second.first != v.value && bad.empty())
      bad = fmt::format(
          "the loss scale changed within the window of optimizer step {}: "
          "{:g} at backward {}, {:g} at backward {}; a dynamic loss scaler "
          "updates once per optimizer step (the scaler updated every "
          "micro-step)",
          v.step, it->second.first, it->second.second, v.value, v.index);
  }
  if (scales > 0) {
    add(r, "loss scale", bad.empty(),
        bad.empty() ? fmt::format("{} backward passes, the scale constant "
                                  "within every window; {} window(s) skipped "
                                  "for overflow",
                                  scales, skips.size())
                    : bad);
    if (!bad.empty())
      findings.push_back(finding(Pitfall::scaler_update_every_micro_step, bad));
  }
  if (skips.empty()) return;
  std::string adv;
  for (int64_t b : skips) {
    // The calls after the skipped window's last backward, before the next.
    const auto& g =
        w.gap[size_t(std::min<int64_t>(b, int64_t(w.gap.size()) - 1))];
    if (g.first > g.second && adv.empty())
      adv = fmt::format(
          "the window ending at backward {} was skipped for overflow (no "
          "optimizer step), yet scheduler.step() was called {} time(s): the "
          "schedule runs ahead of the optimizer",
          b - 1, g.first - g.second);
  }
  add(r, "skipped steps", adv.empty(),
      adv.empty() ? fmt::format("{} window(s) skipped for overflow: no "
                                "optimizer or scheduler step",
                                skips.size())
                  : adv);
  if (!adv.empty())
    findings.push_back(finding(Pitfall::skipped_step_advances_scheduler, adv));
}

// ---- optimizer state

void optimizer_state(const Ctx& c, const StateSection& st, const Walk& w,
                     CertifyReport& r, std::vector<std::string>& findings) {
  // Backward passes up to and including each optimizer step's window.
  std::vector<int64_t> through(c.trace.size(), 0);
  for (const Backward& b : w.backward)
    for (size_t t = size_t(b.step); t < through.size(); ++t) ++through[t];
  std::string bad;
  int64_t rows = 0;
  for (const StateValue& v : st.rows) {
    if (v.kind != "opt_step") continue;
    ++rows;
    if (v.value == double(v.step + 1) || !bad.empty()) continue;
    const bool per_micro = size_t(v.step) < through.size() &&
                           v.value == double(through[size_t(v.step)]);
    bad = fmt::format(
        "state['step'] of {} is {:g} after optimizer step {} (expected {}){}",
        v.tensor, v.value, v.step, v.step + 1,
        per_micro ? ": the backward passes so far, advanced once per "
                    "micro-batch"
                  : "");
    if (per_micro)
      findings.push_back(
          finding(Pitfall::optimizer_state_every_micro_step, bad));
  }
  if (rows == 0) return;
  add(r, "optimizer state", bad.empty(),
      bad.empty() ? fmt::format("state['step'] = t + 1 after every step t "
                                "({} rows, exact)",
                                rows)
                  : bad);
}

// ---- EMA

void ema(const Ctx& c, const LoadedTrace& L, StateSection& st, CertifyReport& r,
         std::vector<std::string>& findings) {
  const ByStep e = gather(st, "ema", c.layout);
  struct Update {
    int64_t steps = 0, since = 0;
  };
  std::map<int64_t, Update> updates;
  for (const StateValue& v : st.rows)
    if (v.kind == "ema_update") updates[v.step] = {v.index, int64_t(v.value)};
  if (updates.empty()) return;
  const std::string decay_text = L.trace.meta_value("ema_decay");
  if (decay_text.empty())
    throw InputError(L.trace.meta_path(), 0, 0, "ema_decay",
                     "state.csv holds EMA updates but meta.csv no ema_decay");
  const double d = std::stod(decay_text);
  const double ulps = error_model::tolerance("state_ema_ulps");
  // Updates per optimizer step, and where.
  std::map<int64_t, int64_t> per_step;
  int64_t mid_window = 0;
  for (const auto& [k, u] : updates) {
    ++per_step[u.steps];
    if (u.since > 0) ++mid_window;
  }
  std::string bad;
  for (const auto& [steps, n] : per_step)
    if ((n != 1 || steps == 0) && bad.empty())
      bad = fmt::format(
          "{} EMA updates {} (expected {}){}", n,
          steps == 0 ? std::string("before the first optimizer step")
                     : fmt::format("after optimizer step {}", steps - 1),
          steps == 0 ? "none: an EMA update follows an optimizer step" : "1",
          mid_window > 0 ? fmt::format("; {} of {} updates between backward "
                                       "passes of a window: the EMA is "
                                       "updated every micro-step",
                                       mid_window, updates.size())
                         : "");
  if (!bad.empty() && mid_window > 0)
    findings.push_back(finding(Pitfall::ema_every_micro_step, bad));
  // Each update replayed from the recorded EMA before it and the
  // parameters it saw.
  double worst = 0;
  std::string value_bad;
  // The first update copies the parameters (AveragedModel) or, an EMA
  // started from the initial parameters (accumcheck's engine, timm's
  // ModelEmaV2), averages them in.
  const std::vector<double> init(c.init.begin(), c.init.end());
  const std::vector<double>* prev = nullptr;
  std::vector<double> last;  // the previous update's values
  size_t replayed = 0;
  for (const auto& [k, u] : updates) {
    const auto it = e.find(k);
    if (it == e.end() || !complete(it->second)) continue;
    ++replayed;
    std::vector<double> now = it->second.vector();
    const std::vector<double> p = params_before(c, u.steps);
    if (!prev && now != p) prev = &init;
    for (size_t i = 0; i < now.size(); ++i) {
      double want = p[i], bound = 0;  // a copy
      if (prev) {
        want = d * (*prev)[i] + (1 - d) * p[i];
        bound =
            ulps * kU * (d * std::fabs((*prev)[i]) + (1 - d) * std::fabs(p[i]));
      }
      const double err = std::fabs(now[i] - want);
      const double ratio = bound > 0 ? err / bound : (err > 0 ? kInf : 0);
      worst = std::max(worst, ratio);
      if (!(err <= bound) && value_bad.empty())
        value_bad = fmt::format(
            "EMA update {}: {}[{}] is {:.9g}, the replay {:.17g} "
            "(err {:.3g}, bound {:.3g})",
            k, c.layout.tensor_of(int64_t(i)).name,
            int64_t(i) - c.layout.tensor_of(int64_t(i)).offset, now[i], want,
            err, bound);
    }
    last = std::move(now);
    prev = &last;
  }
  std::string msg = bad.empty() ? fmt::format(
                                      "{} updates, one after each "
                                      "optimizer step",
                                      updates.size())
                                : bad;
  // Updates whose averaged values the trace lacks are not replayed, and
  // the message says so (no check is hidden behind an "ok").
  if (replayed == 0)
    msg += "; the EMA's values are not in the trace: not replayed";
  else
    msg += replay_text(
        value_bad,
        replayed == updates.size()
            ? fmt::format("each replayed in float64 (decay {:g})", d)
            : fmt::format("{} of {} replayed in float64 (decay {:g}; the "
                          "others' values are not in the trace)",
                          replayed, updates.size(), d),
        worst);
  add(r, "EMA", bad.empty() && value_bad.empty(), msg);
}

// ---- BatchNorm statistics and the logged loss: forwards at the trace's
// parameters over each window's micro-batches.

std::vector<std::vector<int64_t>> window_ids(const Walk& w,
                                             const StateSection& st,
                                             int64_t t) {
  int64_t last_skip = -1;
  for (const StateValue& v : st.rows)
    if (v.kind == "skipped" && v.step == t)
      last_skip = std::max(last_skip, v.index);
  std::vector<std::vector<int64_t>> out;
  for (size_t b = 0; b < w.backward.size(); ++b)
    if (w.backward[b].step == t && int64_t(b) >= last_skip)
      out.push_back(w.backward[b].ids);
  return out;
}

void batchnorm(const Ctx& c, StateSection& st, const Walk& w, double scale,
               CertifyReport& r) {
  // num_batches_tracked is not one of the scenario's buffers: by step.
  std::map<int64_t, std::vector<double>> nbt;
  for (const StateValue& v : st.rows)
    if (v.kind == "num_batches_tracked") nbt[v.step].push_back(v.value);
  if (nbt.empty()) return;
  const ByStep rm = gather(st, "running_mean", c.layout);
  const ByStep rv = gather(st, "running_var", c.layout);
  std::string bad;
  for (const auto& [t, v] : nbt) {
    int64_t forwards = 0;
    for (const Backward& b : w.backward) forwards += b.step <= t;
    for (double x : v)
      if (!std::isnan(x) && x != double(forwards) && bad.empty())
        bad = fmt::format(
            "num_batches_tracked is {:g} at optimizer step {}, but {} "
            "training forwards were made",
            x, t, forwards);
  }
  double worst = 0;
  std::string stats_bad;
  bool replayed = false;
  for (const auto& [t, mean] : rm) {
    if (size_t(t) >= c.trace.size() || !rv.count(t)) continue;
    const auto ids = window_ids(w, st, t);
    if (ids.empty() || std::any_of(ids.begin(), ids.end(),
                                   [](const auto& v) { return v.empty(); }))
      continue;
    Oracle<TD> o(c.s.model, c.data, c.init);
    EngineState<TD> s = o.state();
    const std::vector<double> p = params_before(c, t);
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i] = lift<TD>(p[i]);
    const auto pm = rm.find(t - 1), pv = rv.find(t - 1);
    if (t > 0 && (pm == rm.end() || pv == rv.end())) continue;
    if (int64_t(s.buffers.size()) != c.layout.buffer_total) continue;
    for (const TensorView& tv : c.layout.buffers)
      for (int64_t i = 0; i < tv.size(); ++i) {
        const size_t at = size_t(tv.offset + i);
        if (t > 0) {
          const bool is_mean =
              tv.name.size() >= 4 &&
              tv.name.find("running_mean") != std::string::npos;
          s.buffers[at] = lift<TD>(is_mean ? pm->second[at] : pv->second[at]);
        }
      }
    o.set_state(s);
    for (const auto& b : ids) o.forward_backward(b, LossWeight{1});
    const std::vector<TD>& got = o.buffers();
    std::vector<double> rec(got.size(), kNaN);
    for (const TensorView& tv : c.layout.buffers) {
      const bool is_mean = tv.name.find("running_mean") != std::string::npos;
      for (int64_t i = 0; i < tv.size(); ++i) {
        const size_t at = size_t(tv.offset + i);
        rec[at] = is_mean ? mean[at] : rv.at(t)[at];
      }
    }
    if (!complete(rec)) continue;
    replayed = true;
    const error_model::Comparison cmp = error_model::compare(
        fmt::format("step {} running statistics", t), as_float(rec), got,
        nullptr, error_model::tolerance("bound_slack"), scale);
    worst = std::max(worst, cmp.max_ratio);
    if (!cmp.ok() && stats_bad.empty()) stats_bad = cmp.summary();
  }
  std::string msg = bad.empty() ? "num_batches_tracked = the training "
                                  "forwards so far (exact)"
                                : bad;
  if (replayed)
    msg += replay_text(stats_bad,
                       "running_mean and running_var replayed on the oracle "
                       "over each window's micro-batches",
                       worst);
  add(r, "BatchNorm statistics", bad.empty() && stats_bad.empty(), msg);
}

void logged_loss(const Ctx& c, const StateSection& st, const Walk& w,
                 double scale, CertifyReport& r) {
  const double ulps = error_model::tolerance("logged_loss_ulps");
  std::string bad;
  double worst = 0;
  int64_t n = 0;
  for (const StateValue& v : st.rows) {
    if (v.kind != "logged_loss" || size_t(v.step) >= c.trace.size()) continue;
    const auto ids = window_ids(w, st, v.step);
    if (ids.empty() || std::any_of(ids.begin(), ids.end(),
                                   [](const auto& x) { return x.empty(); }))
      continue;
    Oracle<TD> o(c.s.model, c.data, c.init);
    EngineState<TD> s = o.state();
    const std::vector<double> p = params_before(c, v.step);
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i] = lift<TD>(p[i]);
    o.set_state(s);
    int64_t items = 0;
    std::vector<double> sums, bounds;
    std::vector<int64_t> counts;
    for (const auto& b : ids) {
      const TD l = o.loss(b);
      sums.push_back(double(l.v));
      bounds.push_back(double(l.e));
      counts.push_back(o.items(b));
      items += counts.back();
    }
    double want = 0, bound = 0;
    for (size_t j = 0; j < sums.size(); ++j) {
      want += sums[j] / double(items);
      bound += scale * bounds[j] / double(items) +
               ulps * kU * std::fabs(sums[j]) / double(items);
    }
    ++n;
    const double err = std::fabs(v.value - want);
    worst = std::max(worst, bound > 0 ? err / bound : kInf);
    if (err <= bound || !bad.empty()) continue;
    const double K = double(ids.size());
    const double last_mean = sums.back() / double(counts.back());
    std::string what = "matches no reading of the window's loss";
    if (std::fabs(v.value - K * want) <= K * bound)
      what = fmt::format(
          "{:g} x the window's mean (K = {:g}: a loss divided "
          "by K for backward, multiplied back for the log, or "
          "the micro-batch means summed)",
          K, K);
    else if (std::fabs(v.value - last_mean) <=
             bound * K + ulps * kU * std::fabs(last_mean))
      what = "the last micro-batch's mean only";
    else if (std::fabs(v.value - sums.back() / double(items)) <= bound)
      what = "the last micro-batch's share of the window's loss only";
    bad = fmt::format(
        "window of optimizer step {}: logged {:.9g}, the window's mean item "
        "loss is {:.9g} (bound {:.3g}): {}",
        v.step, v.value, want, bound, what);
  }
  if (n == 0) return;
  add(r, "logged loss", bad.empty(),
      bad.empty()
          ? fmt::format("{} logged losses, each the window's mean "
                        "item loss: max error {:.3g} of the bound "
                        "(judged on its own, not part of training's "
                        "verdict)",
                        n, worst)
          : bad + " (judged on its own, not part of training's verdict)",
      true);
}

}  // namespace

RecordedMoments take_moments(StateSection& st, const ParamLayout& layout) {
  RecordedMoments m;
  if (!st.present) return m;
  m.exp_avg = gather(st, "exp_avg", layout);
  m.exp_avg_sq = gather(st, "exp_avg_sq", layout);
  return m;
}

namespace {
// Step t's recorded moments, where Adam keeps them and both are complete.
bool recorded_moments(const Ctx& c, int64_t t, const TraceValues*& m,
                      const TraceValues*& v) {
  if (!c.moments || c.s.optimizer.kind == OptimizerKind::sgd || t < 0 ||
      size_t(t) >= c.trace.size())
    return false;
  const auto mt = c.moments->exp_avg.find(t);
  const auto vt = c.moments->exp_avg_sq.find(t);
  if (mt == c.moments->exp_avg.end() || vt == c.moments->exp_avg_sq.end() ||
      !complete(mt->second) || !complete(vt->second))
    return false;
  m = &mt->second;
  v = &vt->second;
  return true;
}
}  // namespace

bool moments_recorded(const Ctx& c, int64_t t) {
  const TraceValues *m = nullptr, *v = nullptr;
  return recorded_moments(c, t, m, v);
}

template <class T>
void force_moments(const Ctx& c, int64_t t, std::vector<T>& m,
                   std::vector<T>& v) {
  const TraceValues *rm = nullptr, *rv = nullptr;
  if (!recorded_moments(c, t - 1, rm, rv)) return;
  for (size_t i = 0; i < m.size() && i < rm->size(); ++i) {
    m[i] = lift<T>((*rm)[i]);
    v[i] = lift<T>((*rv)[i]);
  }
}

template <class T>
bool judge_moments(const Ctx& c, int64_t t, const std::vector<T>& m,
                   const std::vector<T>& v, StepEval& ev) {
  const TraceValues *rm = nullptr, *rv = nullptr;
  if (!recorded_moments(c, t, rm, rv) || m.empty()) return false;
  ev.exp_avg = error_model::compare(fmt::format("step {} exp_avg", t),
                                    as_float(*rm), m, &c.layout);
  ev.exp_avg_sq = error_model::compare(fmt::format("step {} exp_avg_sq", t),
                                       as_float(*rv), v, &c.layout);
  return ev.exp_avg.ok() && ev.exp_avg_sq.ok();
}

#define ACCUMCHECK_MOMENTS(T)                                                \
  template void force_moments<T>(const Ctx&, int64_t, std::vector<T>&,       \
                                 std::vector<T>&);                           \
  template bool judge_moments<T>(const Ctx&, int64_t, const std::vector<T>&, \
                                 const std::vector<T>&, StepEval&);
ACCUMCHECK_MOMENTS(TD)
ACCUMCHECK_MOMENTS(TR)
#undef ACCUMCHECK_MOMENTS

void check_state(const Ctx& c, const LoadedTrace& L, StateSection& st,
                 double forward_scale, CertifyReport& r,
                 std::vector<std::string>& findings) {
  if (!st.present) return;
  const Walk w = walk(*L.run);
  loss_scale(st, w, r, findings);
  optimizer_state(c, st, w, r, findings);
  ema(c, L, st, r, findings);
  batchnorm(c, st, w, forward_scale, r);
  logged_loss(c, st, w, forward_scale, r);
}

}  // namespace accumcheck::certify_detail
