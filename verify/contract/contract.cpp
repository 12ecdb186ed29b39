// The contract tier's judging (verify/contract/contract.hpp).
#include "verify/contract/contract.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "oracle/error_model.hpp"
#include "sim/errors.hpp"
#include "sim/trainer.hpp"
#include "verify/certify/lr_channel.hpp"
#include "verify/contract/coefficient_engine.hpp"
#include "verify/trace/trace.hpp"
#include "verify/trace/unseen.hpp"

namespace accumcheck {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Weights = std::map<int64_t, double>;  // micro-batch -> weight

struct Measured {
  // [rank][step]: weight and its uncertainty.
  std::vector<std::vector<Weights>> W, U;
};

// Per rank, W_t = beta W_{t-1} + sum_b a_b w_b e_{m(b)} (b over every
// rank's backward passes: DDP's all-reduce brings the others'),
// uncertainties alongside.
Measured compose(const ContractSection& c, const std::vector<double>& eps,
                 const std::vector<std::vector<double>>& step_bound) {
  Measured out;
  for (int64_t r = 0; r < c.ranks(); ++r) {
    out.W.emplace_back();
    out.U.emplace_back();
    auto& m = out;
    const auto& steps = c.steps[size_t(r)];
    for (size_t t = 0; t < steps.size(); ++t) {
      Weights W, U;
      const double bound = step_bound[size_t(r)][t];
      for (const auto& k : steps[t].coefs) {
        const double da = k.norm > 0 ? bound / k.norm : 0.0;
        if (k.backward < 0) {
          if (t == 0) continue;
          for (const auto& [j, w] : m.W[size_t(r)][t - 1]) {
            W[j] += k.a * w;
            U[j] +=
                da * std::abs(w) + std::abs(k.a) * m.U[size_t(r)][t - 1].at(j);
          }
        } else {
          const ContractBackward& b = c.backward[size_t(k.backward)];
          W[b.micro] += k.a * b.weight;
          U[b.micro] += da * std::abs(b.weight) +
                        std::abs(k.a * b.weight) * eps[size_t(k.backward)];
        }
      }
      m.W[size_t(r)].push_back(std::move(W));
      m.U[size_t(r)].push_back(std::move(U));
    }
  }
  return out;
}

// The semantics the user accepted (meta.csv `accept`: pitfall ids joined by
// '+' or ','; empty: correct).  A framework whose documented loop differs
// from exact large-batch equivalence (Lightning's partial window, say) is
// judged against that loop once the user accepts it by name; the report
// says so.  Unknown ids are the user's mistake (exit 2).
std::vector<Pitfall> accepted_semantics(const Trace& tr) {
  std::vector<Pitfall> out;
  std::string v = tr.meta_value("accept");
  std::replace(v.begin(), v.end(), ',', '+');
  size_t at = 0;
  while (at <= v.size() && !v.empty()) {
    const size_t end = std::min(v.find('+', at), v.size());
    const std::string id = v.substr(at, end - at);
    at = end + 1;
    if (id.empty()) continue;
    const auto p = pitfall_from_id(id);
    if (!p)
      throw InputError(tr.meta_path(), 0, 0, "accept",
                       "unknown pitfall id '" + id +
                           "' (expected pitfall ids as docs/pitfalls.md names "
                           "them, joined by '+')");
    if (std::find(out.begin(), out.end(), *p) == out.end()) out.push_back(*p);
  }
  // The catalog's order, as candidate_semantics names its pairs.
  auto rank = [](Pitfall p) {
    return std::find(std::begin(kAllPitfalls), std::end(kAllPitfalls), p) -
           std::begin(kAllPitfalls);
  };
  std::sort(out.begin(), out.end(),
            [&](Pitfall a, Pitfall b) { return rank(a) < rank(b); });
  return out;
}

// The plan the trainer drew: each epoch's micro-batches in order, plus
// the ones its loader should have drawn and did not; windows of K.  A
// micro-batch m's shard holds ids m*S .. m*S + rows - 1.  With R ranks
// (a DDP trace) micro-step k holds every rank's k-th micro-batch of the
// epoch, as DDP's lockstep runs them.
struct ContractPlan {
  Plan plan;
  int64_t stride = 1;
  std::vector<int64_t> items;  // per micro-batch (drawn, then missing)
  int64_t drawn = 0;
  int64_t micro_batch = 1;
};

ContractPlan contract_plan(const ContractSection& c, int64_t K,
                           const std::string& path) {
  ContractPlan p;
  p.drawn = int64_t(c.micro.size());
  for (const auto& m : c.micro) {
    p.stride = std::max(p.stride, m.samples + 1);
    p.micro_batch = std::max(p.micro_batch, m.samples);
    p.items.push_back(m.items);
  }
  const int64_t R = c.ranks();
  size_t E = 1;
  for (const auto& re : c.epochs) {
    E = std::max(E, re.size());
    for (const auto& e : re) {
      p.stride = std::max(p.stride, e.batch_size + 1);
      p.micro_batch = std::max(p.micro_batch, e.batch_size);
    }
  }
  p.plan.accumulation = K;
  p.plan.ranks = R;
  // [rank][epoch] -> (micro-batch, rows)
  using Drawn = std::vector<std::pair<int64_t, int64_t>>;
  std::vector<std::vector<Drawn>> per(static_cast<size_t>(R),
                                      std::vector<Drawn>(E));
  for (size_t j = 0; j < c.micro.size(); ++j) {
    const int64_t e = std::clamp<int64_t>(c.micro[j].epoch, 0, int64_t(E) - 1);
    per[size_t(c.micro[j].rank)][size_t(e)].push_back(
        {int64_t(j), c.micro[j].samples});
  }
  for (size_t r = 0; r < size_t(R); ++r)
    for (size_t e = 0; e < c.epochs[r].size(); ++e) {
      int64_t seen = 0;
      for (const auto& [j, rows] : per[r][e]) seen += rows;
      const int64_t b = c.epochs[r][e].batch_size;
      for (int64_t left = c.epochs[r][e].dataset - seen; b > 0 && left > 0;
           left -= b) {
        const int64_t rows = std::min(b, left);
        per[r][e].push_back({int64_t(p.items.size()), rows});
        // Its item count is unknown; its rows stand in (only whether it is
        // weighted at all is judged).
        p.items.push_back(rows);
      }
    }
  for (size_t e = 0; e < E; ++e) {
    // DDP's Join (uneven inputs) is not modelled: a rank that runs out
    // takes no part in the later collectives and does not step with the
    // others, which the lockstep plan cannot say.
    for (size_t r = 1; r < size_t(R); ++r)
      if (per[r][e].size() != per[0][e].size())
        throw InputError(
            path, 0, 0, "rank",
            fmt::format("epoch {}: rank {} has {} micro-batches, rank 0 {}: "
                        "uneven inputs across ranks (DDP's Join) are not "
                        "modelled by the contract tier; give every rank the "
                        "same number of micro-batches (DistributedSampler "
                        "pads, or drop_last)",
                        e, r, per[r][e].size(), per[0][e].size()));
    const auto& ms = per[0][e];
    EpochPlan ep;
    ep.accumulation = K;  // the trace's one K (EpochPlan: K per epoch)
    for (size_t at = 0; at < ms.size(); at += size_t(K)) {
      Window w;
      for (size_t k = at; k < std::min(ms.size(), at + size_t(K)); ++k) {
        MicroBatch mb;
        for (size_t r = 0; r < size_t(R); ++r) {
          std::vector<int64_t> ids;
          for (int64_t i = 0; i < per[r][e][k].second; ++i)
            ids.push_back(per[r][e][k].first * p.stride + i);
          mb.shards.push_back(std::move(ids));
        }
        w.micro.push_back(std::move(mb));
      }
      w.partial = int64_t(w.micro.size()) < K;
      ep.windows.push_back(std::move(w));
    }
    p.plan.epochs.push_back(std::move(ep));
  }
  return p;
}

// Step -> the micro-steps of its gradient all-reduces, in order.
using Reduces = std::map<int64_t, std::vector<int64_t>>;

struct Prediction {
  // [rank][step]
  std::vector<std::vector<Weights>> P;
  // [rank][step]: micro-batch -> the parameter version of its g_j
  std::vector<std::vector<std::map<int64_t, int64_t>>> version;
  Reduces reduces;  // step -> the micro-steps of its gradient all-reduces
};

// Step -> the micro-step (within the window) after whose backward each
// of its gradient all-reduces ran, of a predicted run's events.
Reduces all_reduces(const std::vector<Event>& events) {
  Reduces out;
  for (const Event& ev : events)
    if (ev.kind == EventKind::all_reduce) out[ev.step].push_back(ev.micro);
  return out;
}

// The same of a contract trace, whose events name the micro-batch
// (rank 0's index: the merged contract.csv numbers rank 0's first)
// backwarded last: its micro-step is its place among rank 0's
// micro-batches backwarded since the previous step (-1: none).
Reduces all_reduces(const std::vector<Event>& events,
                    const ContractSection& c) {
  std::map<int64_t, std::vector<int64_t>> drawn;  // step -> rank 0's
  for (const auto& b : c.backward) {
    if (c.micro[size_t(b.micro)].rank != 0) continue;
    auto& v = drawn[b.version];
    if (v.empty() || v.back() != b.micro) v.push_back(b.micro);
  }
  Reduces out;
  for (const Event& ev : events) {
    if (ev.kind != EventKind::all_reduce) continue;
    const auto& v = drawn[ev.step];
    const auto it = std::find(v.rbegin(), v.rend(), ev.micro);
    out[ev.step].push_back(it == v.rend() ? -1 : int64_t(v.rend() - it) - 1);
  }
  return out;
}

// The keys of two maps, and a map's value at a key (0 where absent).
template <class V>
std::set<int64_t> keys_of(const std::map<int64_t, V>& a,
                          const std::map<int64_t, V>& b) {
  std::set<int64_t> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  return keys;
}
template <class V>
V at_or_0(const std::map<int64_t, V>& m, int64_t k) {
  const auto it = m.find(k);
  return it == m.end() ? V(0) : it->second;
}

// "" when equal, else the first step whose all-reduces differ: in
// number, or in the micro-steps they ran at.
std::string reduces_differ(const Reduces& trace, const Reduces& pred) {
  const auto at = [](const Reduces& m, int64_t t) {
    const auto it = m.find(t);
    return it == m.end() ? std::vector<int64_t>{} : it->second;
  };
  for (int64_t t : keys_of(trace, pred)) {
    const std::vector<int64_t> a = at(trace, t), b = at(pred, t);
    if (a.size() != b.size())
      return fmt::format("step {}: {} gradient all-reduces, predicted {}", t,
                         a.size(), b.size());
    if (a != b)
      return fmt::format(
          "step {}: the gradient all-reduce{} after the backward of "
          "micro-step {}, predicted after micro-step {}",
          t, a.size() > 1 ? "s ran" : " ran", fmt::join(a, ", "),
          fmt::join(b, ", "));
  }
  return "";
}

// The clip symbols' values of a predicted run: the factor the trainer's
// k-th clip_grad_norm_ call at the same parameter version applied (1 where
// the trainer made no such call: then the accepted loop's clip is judged
// by the clip check, not here).
std::vector<double> clip_symbols(const contract::CoefficientEngine& e,
                                 const ContractSection& c) {
  std::vector<double> sym;
  // (rank, version) -> calls so far
  std::map<std::pair<int64_t, int64_t>, int64_t> seen;
  for (const auto& clip : e.clips()) {
    const int64_t k = seen[{clip.rank, clip.version}]++;
    double v = 1.0;
    int64_t at = 0;
    for (const auto& tc : c.clips)
      if (tc.rank == clip.rank && tc.version == clip.version && at++ == k) {
        v = tc.factor;
        break;
      }
    sym.push_back(v);
  }
  return sym;
}

Prediction predict(const ContractPlan& cp, const Scenario& s, const Behavior& b,
                   const ContractSection& c) {
  contract::CoefficientEngine e([&](const std::vector<int64_t>& ids) {
    int64_t n = 0;
    std::set<int64_t> seen;
    for (int64_t id : ids)
      if (seen.insert(id / cp.stride).second)
        n += cp.items[size_t(id / cp.stride)];
    return n;
  });
  Trainer<contract::CoefficientEngine> t(e, s, b, 1.0,
                                         TrainerOptions::values_unrecorded());
  const Run<double> run = t.run(cp.plan, "prediction");
  const std::vector<double> sym = clip_symbols(e, c);
  Prediction p;
  p.reduces = all_reduces(run.events);
  p.P.resize(size_t(cp.plan.ranks));
  p.version.resize(size_t(cp.plan.ranks));
  for (const auto& st : e.steps()) {
    Weights w;
    std::map<int64_t, int64_t> v;
    for (const auto& [term, coef] : st.grad) {
      if (term.kind != contract::Term::grad) continue;
      const auto& mg = e.micro()[size_t(term.index)];
      const int64_t m = mg.ids.front() / cp.stride;
      w[m] += coef.value(sym);
      v[m] = mg.version;
    }
    p.P[size_t(st.rank)].push_back(std::move(w));
    p.version[size_t(st.rank)].push_back(std::move(v));
  }
  return p;
}

// The trace's gradient all-reduces differ from the accepted semantics'
// (`pred`): the finding of the performance-only pitfall (sim/pitfalls.hpp)
// that, added to the accepted pitfalls, predicts the same weights at the
// same parameter versions and the trace's all-reduces; "" when none.
std::string performance_finding(const ContractPlan& cp, const Scenario& s,
                                const std::vector<Pitfall>& accept,
                                const ContractSection& c,
                                const Prediction& pred, const Reduces& trace,
                                const std::string& accepted) {
  const auto count = [](const Reduces& m) {
    size_t n = 0;
    for (const auto& [t, v] : m) n += v.size();
    return n;
  };
  for (const Pitfall p : kAllPitfalls) {
    if (!pitfall_performance_only(p) ||
        std::find(accept.begin(), accept.end(), p) != accept.end())
      continue;
    std::vector<Pitfall> with = accept;
    with.push_back(p);
    const Prediction q = predict(cp, s, behavior_of(with), c);
    if (q.P != pred.P || q.version != pred.version ||
        !reduces_differ(trace, q.reduces).empty())
      continue;
    return fmt::format(
        "performance: {} ({}): {} gradient all-reduces where {} needs {}; "
        "the values are {}'s",
        pitfall_id(p), pitfall_story(p), count(trace), accepted,
        count(pred.reduces), accepted);
  }
  return "";
}

struct Distance {
  double d = 0;
  int64_t step = -1, micro = -1;
  std::string why;
};

Distance distance(const Measured& m, const Prediction& p,
                  const ContractSection& c) {
  Distance out;
  const size_t R = m.W.size();
  auto who = [&](size_t r) {
    return R > 1 ? fmt::format("rank {} ", r) : std::string();
  };
  for (size_t r = 0; r < R; ++r)
    if (p.P[r].size() != m.W[r].size()) {
      out.d = kInf;
      out.why = fmt::format("{}takes {} optimizer steps, the trace {}", who(r),
                            p.P[r].size(), m.W[r].size());
      return out;
    }
  const double u = error_model::kUnitRoundoff32;
  for (size_t r = 0; r < R; ++r)
    for (size_t t = 0; t < p.P[r].size(); ++t) {
      const Weights& P_t = p.P[r][t];
      const Weights& W_t = m.W[r][t];
      double top = 0;
      for (const auto& [j, w] : P_t) top = std::max(top, std::abs(w));
      for (int64_t j : keys_of(P_t, W_t)) {
        const double P = at_or_0(P_t, j), W = at_or_0(W_t, j);
        const double U = std::max(at_or_0(m.U[r][t], j), u * top);
        double rr = U > 0 ? std::abs(W - P) / U : (W == P ? 0 : kInf);
        std::string why;
        if (P != 0 && j < int64_t(c.micro.size()) &&
            p.version[r][t].at(j) != c.micro[size_t(j)].version) {
          rr = kInf;
          why = fmt::format(
              "{}takes g of micro-batch {} at parameter version {}, the trace "
              "at {}",
              who(r), j, p.version[r][t].at(j), c.micro[size_t(j)].version);
        }
        if (rr > out.d) {
          out = {rr, int64_t(t), j, why};
          if (why.empty())
            out.why = fmt::format(
                "{}step {} micro-batch {}: weight {:.9g}, predicted {:.9g}",
                who(r), t, j, W, P);
        }
      }
    }
  return out;
}

// The accepted lr schedule and clip the recorder declared (meta.csv: lr,
// schedule_kind, schedule_warmup, schedule_total, schedule_step_size,
// schedule_gamma, clip), as a scenario's [optimizer] lr, [schedule] and
// [clip] would give them.
void declared(const Trace& tr, Scenario& s) {
  auto number = [&](const char* key, double fallback) {
    const std::string v = tr.meta_value(key);
    if (v.empty()) return fallback;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end != v.c_str() + v.size() || !std::isfinite(x) || x < 0)
      throw InputError(tr.meta_path(), 0, 0, key,
                       fmt::format("expected a number >= 0, got '{}'", v));
    return x;
  };
  auto integer = [&](const char* key, int64_t fallback) {
    const double x = number(key, double(fallback));
    if (x != std::floor(x) || x > 9e15)
      throw InputError(tr.meta_path(), 0, 0, key, "expected an integer >= 0");
    return int64_t(x);
  };
  s.optimizer.lr = number("lr", 1.0);
  const std::string kind = tr.meta_value("schedule_kind");
  ScheduleSpec& sc = s.schedule;
  if (kind == "table") {
    // A declared scheduler, tabulated by the recorder (schedule.csv): the
    // multipliers of the meta lr, as LambdaLR's base_lr * lambda(n).
    const std::optional<ScheduleTable> t = read_schedule_table(tr.dir);
    if (!t)
      throw InputError(tr.meta_path(), 0, 0, "schedule_kind",
                       "'table' needs schedule.csv beside meta.csv (written "
                       "by ContractRecorder(schedule=...)); record again");
    const double base = s.optimizer.lr > 0 ? s.optimizer.lr : 1.0;
    s.optimizer.lr = base;
    auto multipliers = [&](const std::vector<double>& lr) {
      std::vector<double> m;
      m.reserve(lr.size());
      for (double x : lr) m.push_back(x / base);
      return std::make_shared<const std::vector<double>>(std::move(m));
    };
    sc.table = multipliers(t->lr);
    if (!t->stretched.empty()) sc.stretched_table = multipliers(t->stretched);
  } else if (kind.empty() || kind == "constant") {
    sc.kind = ScheduleKind::constant;
  } else if (kind == "step") {
    sc.kind = ScheduleKind::step;
  } else if (kind == "linear") {
    sc.kind = ScheduleKind::linear;
  } else if (kind == "cosine") {
    sc.kind = ScheduleKind::cosine;
  } else {
    throw InputError(
        tr.meta_path(), 0, 0, "schedule_kind",
        fmt::format("expected constant, step, linear, cosine or table, got "
                    "'{}'",
                    kind));
  }
  sc.warmup = integer("schedule_warmup", 0);
  sc.total = integer("schedule_total", 0);
  sc.step_size = std::max<int64_t>(1, integer("schedule_step_size", 1));
  sc.gamma = number("schedule_gamma", sc.gamma);
  if ((sc.kind == ScheduleKind::linear || sc.kind == ScheduleKind::cosine) &&
      sc.total <= sc.warmup)
    throw InputError(
        tr.meta_path(), 0, 0, "schedule_total",
        fmt::format("expected an integer > schedule_warmup = {}", sc.warmup));
  s.clip.enabled = !tr.meta_value("clip").empty();
  s.clip.max_norm = number("clip", 1.0);
}

// The clip_grad_norm_ calls against the declared clip: one per optimizer
// step, before it, with the declared max_norm, and each factor what
// clip_grad_norm_'s formula gives on the float64 norm of the gradient it
// saw, within gamma_{n+2} (float32 norm of n values, Higham 3.1, and the
// division).  by_shard: the norm of the rank's shard of that gradient
// instead (ddp-clip-local-norm, on a sharded trace).  A clip row without
// max_norm is a scaling a sharded recorder saw on .grad (no clip function
// called): the declared max_norm is its.
CertifyCheck clip_check(const ContractSection& c, const Scenario& s, int64_t n,
                        bool by_shard = false) {
  CertifyCheck ck{"clip", true, false, ""};
  const double nu = double(n + 2) * error_model::kUnitRoundoff32;
  const double rel = nu / (1 - nu);
  double lo = 1, hi = 0;
  for (const auto& cl : c.clips) {
    lo = std::min(lo, cl.factor);
    hi = std::max(hi, cl.factor);
  }
  // clip_grad_norm_(max_norm = inf) only measures the norm (Transformers'
  // Trainer calls it so when max_grad_norm is 0): its factor is exactly
  // 1, the gradient unchanged, so a loop that accepts no clip holds.
  const bool only_measures =
      !c.clips.empty() &&
      std::all_of(c.clips.begin(), c.clips.end(), [](const ContractClip& cl) {
        return std::isinf(cl.max_norm) && cl.max_norm > 0 && cl.factor == 1.0;
      });
  if (!s.clip.enabled && only_measures) {
    ck.message = fmt::format(
        "{} clip_grad_norm_ calls with max_norm inf: factor 1 each, the "
        "gradient unchanged (no clip, as accepted)",
        c.clips.size());
    return ck;
  }
  if (!s.clip.enabled) {
    ck.ok = false;
    ck.message = fmt::format(
        "the trainer called clip_grad_norm_ {} times (max_norm {:.6g}, factors "
        "{:.6g} to "
        "{:.6g}); the accepted loop does not clip (declare "
        "ContractRecorder(clip=...))",
        c.clips.size(), c.clips.front().max_norm, lo, hi);
    return ck;
  }
  std::map<std::pair<int64_t, int64_t>, int64_t> per;  // (rank, version)
  for (const auto& cl : c.clips) ++per[{cl.rank, cl.version}];
  for (int64_t r = 0; r < c.ranks() && ck.ok; ++r)
    for (size_t t = 0; t < c.steps[size_t(r)].size() && ck.ok; ++t)
      if (per[{r, int64_t(t)}] != 1) {
        ck.ok = false;
        ck.message = fmt::format(
            "{}step {}: {} clip_grad_norm_ calls, the accepted loop clips "
            "once before each optimizer step",
            c.ranks() > 1 ? fmt::format("rank {} ", r) : std::string(), t,
            per[{r, int64_t(t)}]);
      }
  const auto want_of = [&](const ContractClip& cl, bool shard) {
    return std::min(
        1.0, s.clip.max_norm / ((shard ? cl.shard_norm : cl.norm) + 1e-6));
  };
  const auto max_of = [&](const ContractClip& cl) {
    return std::isnan(cl.max_norm) ? s.clip.max_norm : cl.max_norm;
  };
  bool seen_on_grad = false, sharded = false;
  for (const auto& cl : c.clips) {
    seen_on_grad = seen_on_grad || std::isnan(cl.max_norm);
    sharded = sharded || !std::isnan(cl.shard_norm);
  }
  for (size_t m = 0; m < c.clips.size() && ck.ok; ++m) {
    const ContractClip& cl = c.clips[m];
    const double want = want_of(cl, by_shard);
    if (max_of(cl) != s.clip.max_norm ||
        !(std::abs(cl.factor - want) <= rel * want)) {
      ck.ok = false;
      ck.message = fmt::format(
          "clip {} (step {}{}): factor {:.9g} {}; the declared max_norm "
          "{:.6g} on {} norm {:.9g} gives {:.9g}",
          m, cl.version,
          c.ranks() > 1 ? fmt::format(", rank {}", cl.rank) : std::string(),
          cl.factor,
          std::isnan(cl.max_norm)
              ? std::string("(a scaling of .grad, no clip function)")
              : fmt::format("with max_norm {:.6g}", cl.max_norm),
          s.clip.max_norm,
          by_shard  ? "its rank's shard's"
          : sharded ? "the whole gradient's"
                    : "the gradient's",
          by_shard ? cl.shard_norm : cl.norm, want);
      if (sharded && !by_shard) {
        // Each rank's factor at that step against the whole gradient's
        // and its own shard's.
        std::string per;
        for (const auto& o : c.clips)
          if (o.version == cl.version)
            per += fmt::format(
                "{}rank {} applied {:.6g}: the whole gradient's norm {:.6g} "
                "gives {:.6g}, its shard's norm {:.6g} gives {:.6g}",
                per.empty() ? "" : "; ", o.rank, o.factor, o.norm,
                want_of(o, false), o.shard_norm, want_of(o, true));
        ck.message += fmt::format(" (step {}: {})", cl.version, per);
      }
    }
  }
  if (ck.ok)
    ck.message = fmt::format(
        "{} {}, one before each step, max_norm {:.6g}: factors {:.6g} to "
        "{:.6g}, each clip_grad_norm_'s formula on {} (within {:.2g})",
        c.clips.size(),
        seen_on_grad ? "clips (scalings of .grad the recorder saw included)"
                     : "clip_grad_norm_ calls",
        s.clip.max_norm, lo, hi,
        by_shard  ? "its rank's shard's norm"
        : sharded ? "the whole gradient's norm (every rank's shard)"
                  : "the gradient it saw",
        rel);
  return ck;
}

std::string fmt_ratio(double x) {
  return std::isinf(x) ? std::string("inf") : fmt::format("{:.3g}", x);
}

// A trace whose optimizer steps are not correct's in number: the counts,
// and the micro-batches that entered no step (rank 0's: drawn and never
// stepped, by epoch; and those its loaders held and never drew), read from
// the trace and its contract plan alone.
std::string step_count_evidence(const ContractSection& c,
                                const ContractPlan& cp,
                                const std::vector<Weights>& W,
                                int64_t correct_steps) {
  if (int64_t(W.size()) == correct_steps) return "";
  std::set<int64_t> stepped;
  for (const Weights& w : W)
    for (const auto& [j, x] : w)
      if (x != 0) stepped.insert(j);
  std::map<int64_t, std::vector<int64_t>> unstepped;  // epoch -> micro
  for (size_t j = 0; j < c.micro.size(); ++j)
    if (c.micro[j].rank == 0 && !stepped.count(int64_t(j)))
      unstepped[c.micro[j].epoch].push_back(int64_t(j));
  std::string out = fmt::format(
      "evidence: {} optimizer steps; correct accumulation takes {}; "
      "micro-batches in no optimizer step:",
      W.size(), correct_steps);
  if (unstepped.empty()) out += " every drawn one was stepped;";
  for (const auto& [e, js] : unstepped)
    out += fmt::format(" epoch {}: {} drawn, never stepped ({});", e, js.size(),
                       fmt::join(js, ", "));
  const int64_t never = int64_t(cp.items.size()) - cp.drawn;
  out += fmt::format(" {} never drawn{}", never,
                     c.ranks() > 1 ? " (all ranks)" : "");
  return out + "\n";
}

// The declared EMA (ContractRecorder.ema: meta.csv ema and ema_decay, the
// ema rows of rank 0; under DDP every rank keeps the same EMA): exactly one
// update after each optimizer step, none before the first, none between
// a window's backward passes and its step; each update d*prev + (1-d)*p
// with the parameters it saw within state_ema_ulps (the first may copy
// them: AveragedModel), error model contract_ema_ulps.  `pitfall` is set to
// ema-every-micro-step when updates come between the backward passes of a
// window.
CertifyCheck ema_check(const Trace& tr, const ContractSection& c,
                       std::string& pitfall) {
  CertifyCheck ck{"EMA", true, false, ""};
  const double d = std::strtod(tr.meta_value("ema_decay").c_str(), nullptr);
  const double ulps =
      d > 0 ? std::max(error_model::tolerance("contract_ema_ulps"),
                       2 + 3 * (1 - d) / d)
            : error_model::tolerance("contract_ema_ulps");
  const int64_t T = int64_t(c.steps[0].size());
  std::vector<const ContractEma*> ups;
  for (const auto& e : c.ema)
    if (e.rank == 0) ups.push_back(&e);
  std::map<int64_t, int64_t> per;  // steps done -> updates
  int64_t mid = 0, early = -1;
  for (const auto* e : ups) {
    ++per[e->version];
    if (e->since > 0 && !e->at_step) ++mid;
    if (e->at_step && early < 0) early = e->version;
  }
  std::string bad;
  for (int64_t v = 0; v <= T && bad.empty(); ++v) {
    const int64_t n = at_or_0(per, v);
    if (v == 0 && n > 0)
      bad = fmt::format("{} EMA update(s) before the first optimizer step", n);
    else if (v > 0 && n != 1)
      bad = fmt::format("{} EMA updates after optimizer step {} (expected 1)",
                        n, v - 1);
  }
  if (!bad.empty() && mid > 0) {
    bad += fmt::format(
        "; {} of {} updates between backward passes of a window: the EMA is "
        "updated every micro-step",
        mid, ups.size());
    pitfall = std::string(pitfall_id(Pitfall::ema_every_micro_step));
  } else if (early >= 0) {
    bad = fmt::format(
        "{}{}an EMA update between the backward passes of step {}'s window "
        "and optimizer.step(): the EMA averaged parameters the step had not "
        "yet moved (update it after optimizer.step())",
        bad, bad.empty() ? "" : "; ", early);
  }
  double worst = 0;
  std::string value_bad;
  for (size_t i = 0; i < ups.size(); ++i) {
    const ContractEma& e = *ups[i];
    double u = std::isnan(e.decay_u) ? kInf : e.decay_u;
    if (i == 0 && !std::isnan(e.copy_u)) u = std::min(u, e.copy_u);
    const double ratio = u / ulps;
    if (ratio > 1 && value_bad.empty())
      value_bad = fmt::format(
          "EMA update {} (after {} optimizer steps): {:.3g} u32 of "
          "d|ema| + (1-d)|p| from ema = d*ema + (1-d)*p with the declared "
          "decay {:.6g} (bound {:g} u32); it moved as decay {:.6g}",
          i, e.version, u, d, ulps, e.fitted);
    worst = std::max(worst, ratio);
  }
  ck.ok = bad.empty() && value_bad.empty();
  if (ck.ok)
    ck.message = fmt::format(
        "{} EMA updates ({}, decay {:.6g}), one after each optimizer step: "
        "each d*ema + (1-d)*p of the stepped parameters within {} of the bound "
        "({:g} u32)",
        ups.size(), tr.meta_value("ema"), d, fmt_ratio(worst), ulps);
  else
    ck.message = bad.empty()
                     ? value_bad
                     : (value_bad.empty() ? bad : bad + "; " + value_bad);
  return ck;
}

// What the contract tier did not judge in this run (printed with every
// verdict, never left out).
std::string not_judged(const Trace& tr) {
  std::vector<std::string> out = {
      "the model's numerics (each g_j is measured from your forward, not "
      "derived)",
      "the optimizer's state from step to step (each step is replayed from "
      "the state it had: optimizer-state-every-micro-step is the oracle "
      "tier's)"};
  if (tr.meta_value("ema").empty())
    out.push_back("EMA: none declared (rec.ema(...))");
  if (!tr.meta_value("batchnorm").empty())
    out.push_back(fmt::format("BatchNorm running statistics ({} modules)",
                              tr.meta_value("batchnorm")));
  out.push_back("a loss scaler's scale and skipped steps (GradScaler)");
  std::string s = "not judged: ";
  for (size_t i = 0; i < out.size(); ++i) s += (i ? "; " : "") + out[i];
  return s;
}

}  // namespace

// Model-free evidence (verify/contract/evidence.cpp).
std::vector<std::string> contract_evidence(const ContractSection& c,
                                           const std::vector<Weights>& W,
                                           const std::vector<Weights>& correct,
                                           int64_t K);

// A bfloat16 / float16 model's weights are read to its fit bound eps (a
// few u_bf16 of their value): whether that resolution tells correct
// accumulation (the ranking's first, the accepted semantics) apart from
// every other modelled candidate, i.e. each lies more than its uncertainty
// from the trace (candidates with correct's very prediction are its
// aliases, as in float32).  Where correct fits and another candidate fits
// too, the trace cannot back a verdict: exit 2.
static CertifyCheck resolution_check(const CertifyReport& r,
                                     const std::vector<double>& eps,
                                     double cal_max,
                                     const std::string& trace_dir) {
  const bool correct_ok = r.ranking.front().distance <= 1;
  double eps_max = 0;
  for (const double e : eps) eps_max = std::max(eps_max, e);
  size_t near = 0;
  for (size_t k = 1; k < r.ranking.size(); ++k)
    if (near == 0 || r.ranking[k].distance < r.ranking[near].distance) near = k;
  const std::string read = fmt::format(
      "{} parameters: each micro-batch gradient read to {:.3g} of its norm "
      "(its {} backward differs from float64 by {:.3g})",
      r.precision, eps_max, r.precision, cal_max);
  if (near == 0)
    return {"precision", true, false, read + "; no other candidate"};
  if (!correct_ok) return {"precision", true, false, read};
  const CertifyCandidate& other = r.ranking[near];
  if (other.distance <= 1)
    throw InputError(
        trace_dir + "/contract.csv", 0, 0, "calibration",
        fmt::format(
            "{}: at that resolution the weights fit {} (at {} of the "
            "uncertainty) as well as {} (at {}): the contract tier cannot "
            "tell them apart; certify a float32 run of the same loop",
            read, r.accepted, fmt_ratio(r.ranking.front().distance), other.name,
            fmt_ratio(other.distance)));
  return {"precision", true, false,
          fmt::format("{}; the nearest other candidate, {}, at {} of the "
                      "uncertainty",
                      read, other.name, fmt_ratio(other.distance))};
}

CertifyReport certify_contract(const std::string& trace_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  const Trace tr = read_trace(trace_dir);
  if (tr.meta_value("tier") != "contract")
    throw InputError(
        tr.meta_path(), 0, 0, "tier",
        "not a contract-tier trace (meta.csv has no 'tier,contract'); "
        "judge oracle-tier traces with `certify SCENARIO --trace DIR`");
  const ContractSection c = read_contract(trace_dir);
  int64_t K = 0;
  try {
    K = std::stoll(tr.meta_value("accumulation"));
  } catch (...) {
    K = 0;
  }
  if (K < 1)
    throw InputError(tr.meta_path(), 0, 0, "accumulation",
                     "expected an integer >= 1");
  const bool tokens = tr.meta_value("items") == "tokens";
  Scenario s;
  s.name = "contract";
  declared(tr, s);
  int64_t n = 0;
  try {
    n = std::stoll(tr.meta_value("parameters"));
  } catch (...) {
    n = 0;
  }
  CertifyReport r;
  r.scenario = "contract";
  r.run = tr.runs.empty() ? "trainer" : tr.runs.front().name;
  r.engine = tr.meta_value("engine");
  r.precision = tr.meta_value("precision");
  const std::vector<Pitfall> accept = accepted_semantics(tr);
  r.accepted = semantics_name(accept);
  r.trace_steps = int64_t(c.steps[0].size());
  const std::string ranks_said =
      c.ranks() > 1 ? fmt::format(" on each of {} ranks", c.ranks()) : "";

  const double u = error_model::kUnitRoundoff32;
  const double fit_cal = error_model::tolerance("contract_fit_calibration");
  const double fit_ulps = error_model::tolerance("contract_fit_ulps");
  const double sum_ulps = error_model::tolerance("contract_sum_ulps");
  const double replay_ulps = error_model::tolerance("contract_replay_ulps");

  // 1. Each backward's weight fit, against its calibrated bound.
  double cal_max = 0;
  size_t cal_at = 0;
  for (size_t j = 0; j < c.micro.size(); ++j)
    if (!std::isnan(c.micro[j].calibration) &&
        c.micro[j].calibration > cal_max) {
      cal_max = c.micro[j].calibration;
      cal_at = j;
    }
  // A bfloat16 (or float16) model: its gradients differ from their
  // float64 recompute by its own rounding, far more than float32's, and
  // its loss weight may be rounded in that precision.  Its weights are read
  // with that uncertainty (the fit bound below: contract_fit_calibration x
  // the calibrated difference + contract_fit_ulps in the model's unit
  // roundoff), and the trace is judged only where that resolution tells
  // correct accumulation apart from every modelled candidate (the
  // "precision" check below, after the ranking).
  const bool lowp_model = r.precision == "bfloat16" || r.precision == "float16";
  if (!lowp_model && r.precision != "float32" && r.precision != "float64")
    throw InputError(trace_dir + "/meta.csv", 0, 0, "precision",
                     "'" + r.precision +
                         "': expected float32, float64, bfloat16 or "
                         "float16 (the model parameters' dtype)");
  const double u_model =
      r.precision == "bfloat16"  ? error_model::buffer_unit(GradBuffer::bf16)
      : r.precision == "float16" ? error_model::buffer_unit(GradBuffer::fp16)
                                 : u;
  // A float64 recompute of g_j that strays from the float32 one by more
  // than the precision at which weights are read (evidence_weight_rel) is
  // not the same function (randomness the recorder could not replay, such
  // as a compiled graph's own RNG): the weights would be too uncertain to
  // tell correct from a mistake, so the trace is not judged.
  const double weight_rel = error_model::tolerance("evidence_weight_rel");
  if (cal_max > weight_rel && !lowp_model)
    throw InputError(
        trace_dir + "/contract.csv", 0, 0, "calibration",
        fmt::format(
            "micro-batch {}'s gradient recomputed in float64 differs from "
            "the float32 one by {:.3g} of its norm (at most {:g} reads a "
            "weight): the recompute is not the forward your loop ran "
            "(randomness the recorder could not replay, e.g. a "
            "torch.compile'd model compiled before the recorder was made); "
            "record again with the recorder made first",
            cal_at, cal_max, weight_rel));
  std::vector<double> eps;
  CertifyCheck fit{"weight fit", true, false, ""};
  double worst_fit = 0;
  int64_t worst_b = -1;
  for (size_t b = 0; b < c.backward.size(); ++b) {
    const ContractBackward& bw = c.backward[b];
    const double cal = c.micro[size_t(bw.micro)].calibration;
    const double bound =
        fit_cal * (std::isnan(cal) ? cal_max : cal) + fit_ulps * u_model;
    eps.push_back(bound);
    const double ratio = std::isnan(bw.residual) ? kInf : bw.residual / bound;
    if (ratio > worst_fit || worst_b < 0) {
      worst_fit = ratio;
      worst_b = int64_t(b);
    }
  }
  if (worst_b >= 0) {
    const auto& bw = c.backward[size_t(worst_b)];
    fit.ok = worst_fit <= 1;
    fit.message = fmt::format(
        "{} backward passes, each w*g_j: worst residual {:.3g} = {} of its "
        "bound "
        "(backward {}, micro-batch {})",
        c.backward.size(), bw.residual, fmt_ratio(worst_fit), worst_b,
        bw.micro);
    if (!fit.ok)
      fit.message +=
          ": that gradient is not a multiple of the micro-batch's g_j "
          "(another loss than the declared summed loss, other "
          "randomness, or the gradient changed inside the backward)";
  } else {
    fit.ok = false;
    fit.message = "no backward pass recorded";
  }
  r.checks.push_back(fit);

  // 2. Each step's consumed gradient as a combination of what .grad held.
  // With R ranks the b run over every rank's backward passes (DDP's
  // all-reduce brings them), each rank's step fitted on its own.
  std::vector<std::vector<double>> step_bound(size_t(c.ranks()));
  CertifyCheck sfit{"step fit", true, false, ""};
  double worst_step = 0;
  for (int64_t q = 0; q < c.ranks(); ++q)
    for (const auto& st : c.steps[size_t(q)]) {
      const double bound = (double(st.terms) + sum_ulps) * u * st.scale;
      step_bound[size_t(q)].push_back(bound);
      const double ratio =
          bound > 0 ? st.residual / bound : (st.residual == 0 ? 0 : kInf);
      worst_step = std::max(worst_step, ratio);
    }
  sfit.ok = worst_step <= 1;
  sfit.message = fmt::format(
      "{} optimizer steps{}, each consumed gradient = beta*G_prev + sum a_b "
      "c_b: worst residual {} of its bound",
      c.steps[0].size(), ranks_said, fmt_ratio(worst_step));
  // A step fit outside its float32 bound: a bf16 gradient buffer
  // (low-precision-grad-buffer) when every consumed gradient is made of
  // bfloat16 numbers (the recorder counts the elements bf16 cannot hold)
  // and each residual is within the bf16 accumulation bound (error model
  // unit_roundoff_bf16: each of the m terms rounded, m - 1 additions each
  // rounded twice, u' = (1 + u32)(1 + u_bf16) - 1, gamma over m +
  // contract_sum_ulps as for float32; underflow_bf16 per rounding, normwise
  // over the n parameters).  Anything else changed .grad unseen: exit 2.
  std::vector<std::vector<double>> lowp_bound(size_t(c.ranks()));
  bool lowp = false;
  if (!sfit.ok) {
    const double ub =
        (1 + u) * (1 + error_model::tolerance("unit_roundoff_bf16")) - 1;
    const double eta = error_model::tolerance("underflow_bf16");
    double worst_lowp = 0;
    int64_t off = 0, worst_t = 0, worst_q = 0;
    for (int64_t q = 0; q < c.ranks(); ++q)
      for (size_t t = 0; t < c.steps[size_t(q)].size(); ++t) {
        const ContractStep& st = c.steps[size_t(q)][t];
        const double m = double(st.terms) + sum_ulps;
        const double bound =
            (m * ub < 1 ? m * ub / (1 - m * ub) : kInf) * st.scale +
            std::sqrt(double(n)) * (2 * double(st.terms) + 1) * eta;
        lowp_bound[size_t(q)].push_back(bound);
        off = std::max(off, st.off_bf16 < 0 ? n + 1 : st.off_bf16);
        const double ratio = step_bound[size_t(q)][t] > 0
                                 ? st.residual / step_bound[size_t(q)][t]
                                 : kInf;
        if (ratio >= worst_step) {
          worst_t = int64_t(t);
          worst_q = q;
        }
        worst_lowp = std::max(worst_lowp, st.residual / bound);
      }
    lowp = off == 0 && worst_lowp <= 1;
    if (lowp) {
      sfit.message += fmt::format(
          ": every consumed gradient is made of bfloat16 numbers and each "
          "residual is within the bf16 accumulation bound (max {}): .grad "
          "accumulates in bfloat16 (or is rounded to it before the step)",
          fmt_ratio(worst_lowp));
    } else {
      const ContractStep& st = c.steps[size_t(worst_q)][size_t(worst_t)];
      throw InputError(
          trace_dir + "/contract.csv", 0, 0, "step",
          fmt::format(
              "{}step {}: the gradient optimizer.step() consumed is not made "
              "of the backward passes since the previous step (residual {} "
              "of its float32 bound; {}): .grad was changed by something the "
              "recorder did not see (a gradient hook registered before the "
              "recorder, an edit of .grad between backward and step, a "
              "buffer or a reduction in another precision). certify does not "
              "judge a loop "
              "on what it was not shown: make the recorder before any "
              "gradient hook, or remove the change, and record again",
              c.ranks() > 1 ? fmt::format("rank {} ", worst_q) : "", worst_t,
              fmt_ratio(worst_step),
              st.off_bf16 < 0
                  ? std::string("the trace does not say whether it is bf16")
              : st.off_bf16 > 0 && worst_lowp <= 1
                  // Within the bf16 bound, yet no bf16 .grad: what bf16
                  // rounding after a float32 accumulation would give.
                  ? fmt::format("{} of its {} elements are no bfloat16 "
                                "numbers: no bf16 gradient buffer; every step "
                                "is within the bf16 accumulation bound (max "
                                "{}), as bfloat16 rounding after a float32 "
                                "accumulation would be (a gradient reduction "
                                "in bfloat16? reduce in float32)",
                                st.off_bf16, n, fmt_ratio(worst_lowp))
                  : st.off_bf16 > 0
                        ? fmt::format("{} of its {} elements are no bfloat16 "
                                      "numbers: no bf16 gradient buffer",
                                      st.off_bf16, n)
                        : fmt::format("bfloat16 numbers, but {} of the bf16 "
                                      "accumulation bound",
                                      fmt_ratio(worst_lowp))));
    }
  }
  r.checks.push_back(sfit);

  // 3. The optimizer update, replayed in float64.
  CertifyCheck rep{"optimizer replay", true, false, ""};
  double worst_rep = 0;
  for (const auto& steps : c.steps)
    for (const auto& st : steps)
      worst_rep = std::max(
          worst_rep, std::isnan(st.replay) ? kInf : st.replay / replay_ulps);
  rep.ok = worst_rep <= 1;
  rep.message = fmt::format(
      "PyTorch's optimizer class replayed from the recorded parameters, state "
      "and "
      "gradient: worst {} of the bound ({} u32 of |p| + |update|)",
      fmt_ratio(worst_rep), replay_ulps);
  r.checks.push_back(rep);

  // 3b. The clip factors, when the loop clips or the recorder declared one
  // (on the norm the accepted loop's clip takes).  A sharded trace (its
  // clips' shard norms recorded) judges each candidate's clip rule too:
  // the whole gradient's norm, or ddp-clip-local-norm's shard norm.
  const bool judge_clip = s.clip.enabled || !c.clips.empty();
  const bool shard_clips = std::any_of(
      c.clips.begin(), c.clips.end(),
      [](const ContractClip& cl) { return !std::isnan(cl.shard_norm); });
  bool clip_ok = true;
  if (judge_clip) {
    const CertifyCheck ck =
        clip_check(c, s, n, behavior_of(accept).clip_local_norm);
    clip_ok = ck.ok;
    r.checks.push_back(ck);
  }

  // 3c. The declared EMA.
  std::string ema_pitfall;
  bool ema_ok = true;
  if (!tr.meta_value("ema").empty()) {
    const CertifyCheck ck = ema_check(tr, c, ema_pitfall);
    ema_ok = ck.ok;
    r.checks.push_back(ck);
  }

  // 4. Which g_j with which weights: against every semantics (with a bf16
  // gradient buffer, its own candidates, their uncertainty propagated
  // from the bf16 step bound).
  const Measured meas = compose(c, eps, step_bound);
  const Measured meas_lowp = lowp ? compose(c, eps, lowp_bound) : Measured{};
  const ContractPlan cp = contract_plan(c, K, trace_dir + "/contract.csv");
  s.batching.accumulation = K;
  s.batching.micro_batch = cp.micro_batch;
  s.batching.epochs = int64_t(cp.plan.epochs.size());
  s.model.kind = tokens ? ModelKind::token : ModelKind::mlp;
  // A trace with fewer optimizer steps than the accepted loop takes
  // stopped short: the step budget is a candidate beside every pair.
  const bool stopped_short =
      predict(cp, s, behavior_of(accept), c).P[0].size() > c.steps[0].size();
  std::vector<std::vector<Pitfall>> sems =
      candidate_semantics({.token_loss = tokens,
                           .contract_tier = true,
                           .contract_lowp_buffer = lowp,
                           .stopped_short = stopped_short,
                           .contract_shard_clip = shard_clips});
  // The accepted semantics first: every check below is against it.
  sems.erase(std::remove(sems.begin(), sems.end(), accept), sems.end());
  sems.insert(sems.begin(), accept);
  std::vector<Prediction> preds;
  std::vector<bool> lowps, shard_rules;
  std::vector<Distance> dists;
  std::vector<std::vector<double>> lrs;
  // DDP's gradient all-reduces per step (the recorder saw them: a
  // DistributedDataParallel module), against each semantics' own.
  const bool reduces_seen =
      c.ranks() > 1 && tr.meta_value("all_reduces") == "seen";
  Reduces trace_reduces;
  if (reduces_seen && !tr.runs.empty()) {
    std::vector<Event> evs;
    for (const auto& te : tr.runs.front().events) evs.push_back(te.event);
    trace_reduces = all_reduces(evs, c);
  }
  std::string reduce_correct;  // "" or how correct's count differs
  // The all-reduces differ from the accepted semantics' only as a
  // performance-only pitfall's (the same weights): its finding.
  std::string reduce_perf;
  LrChannel lr_correct;
  Distance correct_weights;  // correct's weight distance, whatever its lr
  // Per candidate (r.ranking's order before sorting): its weight distance
  // whatever its lr, and whether its lr is the trace's.  A failed lr
  // check does not hide what the weights say (and the other way round).
  std::vector<double> weight_d;
  std::vector<bool> lr_ok;
  // A declared table the recorder could not rebuild with a K times longer
  // horizon: schedule-horizon-in-micro-steps has no lr to judge.
  const bool horizon_unjudged =
      s.schedule.table != nullptr && s.schedule.stretched_table == nullptr;
  const bool fits_ok = fit.ok && sfit.ok && rep.ok && clip_ok && ema_ok;
  for (const auto& sem : sems) {
    // When the trace passes (every fit within its bound and correct
    // within 1, lr included), the ranking is not printed: the other
    // candidates are not predicted at all.
    // A low-precision model's every candidate is predicted: its PASS
    // needs each of them told apart (the "precision" check).
    if (!preds.empty() && fits_ok && r.ranking.front().distance <= 1 &&
        !lowp_model)
      break;
    if (horizon_unjudged && sem != accept &&
        std::find(sem.begin(), sem.end(),
                  Pitfall::schedule_horizon_in_micro_steps) != sem.end())
      continue;
    const Prediction p = predict(cp, s, behavior_of(sem), c);
    const bool sem_lowp = behavior_of(sem).low_precision_grad_buffer;
    const bool sem_shard = behavior_of(sem).clip_local_norm;
    Distance d = distance(sem_lowp ? meas_lowp : meas, p, c);
    // The weights check: correct's weights, with a bf16 .grad's
    // uncertainty where .grad accumulates in bf16.
    const Distance d_weights =
        lowp && !sem_lowp ? distance(meas_lowp, p, c) : d;
    if (lowp && !sem_lowp) {
      d.d = kInf;
      d.why = fmt::format(
          "step fit: residual {} of the float32 bound, a float32 .grad's",
          fmt_ratio(worst_step));
    }
    // The lr channel: each step's lr against this semantics' schedule.
    LrChannel lr;
    if (!tr.runs.empty())
      lr = check_lr(s, cp.plan, tr.runs.front(), behavior_of(sem));
    const std::string reduce_why =
        reduces_seen ? reduces_differ(trace_reduces, p.reduces) : "";
    if (preds.empty()) {
      lr_correct = lr;
      correct_weights = d_weights;
      reduce_correct = reduce_why;
      if (!reduce_why.empty()) {
        reduce_perf =
            performance_finding(cp, s, accept, c, p, trace_reduces, r.accepted);
        if (!reduce_perf.empty()) reduce_correct.clear();
      }
    }
    if (!reduce_why.empty() && reduce_perf.empty()) {
      d.d = kInf;
      d.why = reduce_why;
    }
    // The clip symbols take the trace's factors: which norm gave them is
    // the candidate's clip rule, judged here.
    if (shard_clips && judge_clip) {
      const CertifyCheck ck = clip_check(c, s, n, sem_shard);
      if (!ck.ok) {
        d.d = kInf;
        d.why = "clip: " + ck.message;
      }
    }
    const double wd = d.d;
    if (!lr.ok) {
      d.d = kInf;
      d.why = lr.message;
    }
    // Semantics with the same prediction (e.g. scheduler pitfalls: the
    // contract tier sees weights, not the lr) are one candidate.
    bool merged = false;
    for (size_t k = 0; k < preds.size(); ++k)
      if (preds[k].P == p.P && preds[k].version == p.version &&
          lowps[k] == sem_lowp && lrs[k] == lr.accepted_lr &&
          (!shard_clips || shard_rules[k] == sem_shard) &&
          (!reduces_seen || preds[k].reduces == p.reduces)) {
        r.ranking[k].aliases.push_back(semantics_name(sem));
        merged = true;
        break;
      }
    if (merged) continue;
    CertifyCandidate cand;
    cand.name = semantics_name(sem);
    cand.pitfalls = sem;
    cand.steps = int64_t(p.P[0].size());
    cand.distance = d.d;
    cand.tracked = true;
    cand.first_out = d.step;
    cand.first_out_what = d.why;
    r.ranking.push_back(cand);
    preds.push_back(p);
    lowps.push_back(sem_lowp);
    shard_rules.push_back(sem_shard);
    dists.push_back(d);
    lrs.push_back(lr.accepted_lr);
    weight_d.push_back(wd);
    // Its lr explains the trace's only where it also takes as many steps
    // (the channel compares the steps both have).
    lr_ok.push_back(lr.checked && lr.ok &&
                    lr.accepted_lr.size() == lr.trace_lr.size());
  }
  // The weights' best match (the fewest pitfalls among the nearest) and
  // the lr's (correct, or the first single pitfall whose lr is the
  // trace's): named each when no one candidate explains both.
  int64_t by_weights = -1, by_lr = -1;
  for (size_t k = 0; k < r.ranking.size(); ++k) {
    const auto& cand = r.ranking[k];
    if (by_weights < 0 || weight_d[k] < weight_d[size_t(by_weights)] ||
        (weight_d[k] == weight_d[size_t(by_weights)] &&
         cand.pitfalls.size() < r.ranking[size_t(by_weights)].pitfalls.size()))
      by_weights = int64_t(k);
    if (by_lr < 0 && lr_ok[k] && cand.pitfalls.size() <= 1) by_lr = int64_t(k);
  }
  const CertifyCandidate correct = r.ranking.front();
  r.expected_steps = correct.steps;
  const bool structure_ok = correct_weights.d <= 1;
  CertifyCheck st{
      "weights", structure_ok, false,
      fmt::format("which g_j with which weight each step holds, against "
                  "{}: max {} of the uncertainty{}{}",
                  r.accepted, fmt_ratio(correct_weights.d),
                  lowp ? " (a bf16 .grad's: the bf16 step bound)" : "",
                  structure_ok ? "" : " (" + correct_weights.why + ")")};
  r.checks.push_back(st);
  if (lowp_model)
    r.checks.push_back(resolution_check(r, eps, cal_max, trace_dir));
  if (reduces_seen) {
    int64_t n = 0;
    for (const auto& [t, k] : trace_reduces) n += int64_t(k.size());
    CertifyCheck rc{
        "all-reduce", reduce_correct.empty(), false,
        !reduce_perf.empty()
            ? fmt::format("{} gradient all-reduces (the values are {}'s)", n,
                          r.accepted)
        : reduce_correct.empty()
            ? fmt::format("{} gradient all-reduces, one per step at the "
                          "window's last micro-step (no_sync before it)",
                          n)
            : reduce_correct +
                  " (correct: one per step, at the window's "
                  "last micro-step)"};
    rc.performance = reduce_perf;
    r.checks.push_back(rc);
  }
  if (lr_correct.checked) {
    std::string msg = lr_correct.message;
    if (msg.rfind("lr: ", 0) == 0) msg = msg.substr(4);
    CertifyCheck lc{"lr", lr_correct.ok, false, msg};
    if (!lr_correct.ok) lc.message += ": " + lr_correct.evidence;
    r.checks.push_back(lc);
  }
  r.pass = fit.ok && sfit.ok && rep.ok && clip_ok && structure_ok &&
           lr_correct.ok && reduce_correct.empty() && ema_ok;
  r.notes.push_back(not_judged(tr));
  // Their names (by_weights, by_lr index the ranking before sorting).
  const double weights_best =
      by_weights >= 0 ? weight_d[size_t(by_weights)] : kInf;
  const std::string weights_name =
      by_weights >= 0 ? r.ranking[size_t(by_weights)].name : "";
  const std::string lr_name = by_lr >= 0 ? r.ranking[size_t(by_lr)].name : "";
  const std::string horizon_note =
      horizon_unjudged
          ? "not judged: schedule-horizon-in-micro-steps (the declared "
            "scheduler cannot be rebuilt with a K times longer horizon: "
            "declare a factory of (optimizer, scale), docs/tiers.md)"
          : "";
  std::stable_sort(
      r.ranking.begin(), r.ranking.end(),
      [](const auto& a, const auto& b) { return a.distance < b.distance; });
  if (r.pass) {
    r.verdict = fmt::format(
        "PASS (contract tier): {} steps{}; every step holds the micro-batch "
        "gradients "
        "{} predicts (max {} of the uncertainty){}",
        c.steps[0].size(), ranks_said,
        accept.empty() ? std::string("correct accumulation")
                       : "the accepted " + r.accepted,
        fmt_ratio(correct.distance),
        lr_correct.checked ? "; lr as declared" : "");
    if (!accept.empty())
      for (const Pitfall p : accept)
        r.verdict += fmt::format(
            "\naccepted: {} (meta.csv accept; not exact large-batch "
            "equivalence: {})",
            pitfall_id(p), pitfall_story(p));
    r.ranking.clear();
  } else {
    r.verdict = "FAIL (contract tier): ";
    for (const auto& ck : r.checks)
      if (!ck.ok) {
        r.verdict += ck.name + ": " + ck.message;
        break;
      }
    refuse_unseen(tr, r.pass, r.verdict);
    const CertifyCandidate& best = r.ranking.front();
    const double next = r.ranking.size() > 1 ? r.ranking[1].distance : kInf;
    std::string names = best.name;
    if (!best.aliases.empty())
      names += " (same weights: " + best.aliases.front() +
               (best.aliases.size() > 1 ? ", ..." : "") + ")";
    const bool only_ema = !ema_ok && fit.ok && sfit.ok && rep.ok && clip_ok &&
                          structure_ok && lr_correct.ok &&
                          reduce_correct.empty();
    if (only_ema) {
      // The gradients, steps and lr are correct's; the EMA is not.
      const std::string weights =
          fmt::format("the weights are correct's: max {} of the uncertainty",
                      fmt_ratio(correct_weights.d));
      std::string ema_msg;
      for (const auto& ck : r.checks)
        if (ck.name == "EMA") ema_msg = ck.message;
      r.diagnosis =
          ema_pitfall.empty()
              ? fmt::format(
                    "diagnosis: no modelled pitfall explains this trace\n"
                    "evidence: {}\nevidence: {}",
                    ema_msg, weights)
              : fmt::format("diagnosis: matches {} ({})\nevidence: {}",
                            ema_pitfall, weights, ema_msg);
      r.ranking.clear();
    } else if (best.distance <= 1) {
      r.diagnosis = fmt::format(
          "diagnosis: matches {} (max {} of the uncertainty)\nmargin: next is "
          "{} at {} "
          "({}x the best)",
          names, fmt_ratio(best.distance),
          r.ranking.size() > 1 ? r.ranking[1].name : "-", fmt_ratio(next),
          fmt_ratio(best.distance > 0 ? next / best.distance : kInf));
      const std::string steps_said =
          step_count_evidence(c, cp, meas.W[0], correct.steps);
      if (!steps_said.empty())
        r.diagnosis += "\n" + steps_said.substr(0, steps_said.size() - 1);
    } else if (weights_best <= 1 && weights_name != semantics_name(accept) &&
               lr_correct.checked && !lr_correct.ok) {
      // The weights match a candidate whose lr is not the trace's: each
      // channel's diagnosis.
      r.diagnosis = fmt::format(
          "diagnosis: matches {} (weights, max {} of the uncertainty) and {} "
          "(lr)\nevidence: {}",
          weights_name, fmt_ratio(weights_best),
          lr_name.empty() ? std::string("no modelled lr pitfall") : lr_name,
          lr_correct.evidence);
    } else {
      r.diagnosis = "diagnosis: no modelled pitfall explains this trace\n";
      if (structure_ok)
        r.diagnosis += fmt::format(
            "evidence: the weights are {}'s (max {} of the uncertainty); "
            "the lr "
            "is not\n",
            r.accepted, fmt_ratio(correct_weights.d));
      else
        for (const auto& line :
             contract_evidence(c, meas.W[0], preds.front().P[0], K))
          r.diagnosis += "evidence: " + line + "\n";
      if (!lr_correct.ok)
        r.diagnosis += "evidence: " + lr_correct.evidence + "\n";
      if (!lr_correct.ok && !lr_name.empty())
        r.diagnosis += fmt::format("evidence: the lr matches {}\n", lr_name);
      if (!reduce_correct.empty())
        r.diagnosis += "evidence: all-reduce: " + reduce_correct + "\n";
      if (!s.clip.enabled && !c.clips.empty()) {
        // The trainer clips and the recorder was not told: correct with
        // that clip, for the evidence.
        Scenario clipped = s;
        clipped.clip.enabled = true;
        clipped.clip.max_norm = c.clips.front().max_norm;
        const Distance d =
            distance(meas, predict(cp, clipped, behavior_of({}), c), c);
        r.diagnosis += fmt::format(
            "evidence: with clip_grad_norm_(max_norm = {:.6g}) accepted, the "
            "weights are "
            "{}correct's (max {} of the uncertainty)\n",
            clipped.clip.max_norm, d.d <= 1 ? "" : "still not ",
            fmt_ratio(d.d));
      }
      r.diagnosis += fmt::format(
          "closest (not matching): {} at {} of the uncertainty ({})", names,
          fmt_ratio(best.distance), best.first_out_what);
    }
    if (!horizon_note.empty()) r.diagnosis += "\n" + horizon_note;
  }
  // What the recorder saw and reports (meta.csv's `notes`: e.g. a
  // backward that drew random numbers after its forward).
  if (const std::string notes = tr.meta_value("notes"); !notes.empty())
    r.diagnosis += (r.diagnosis.empty() ? "" : "\n") +
                   std::string("note (recorder): ") + notes;
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return r;
}

std::string contract_text(const CertifyReport& r, int top) {
  std::string o;
  for (const auto& c : r.checks)
    o += fmt::format("{} {}: {}\n", c.ok ? "ok  " : "FAIL", c.name, c.message);
  o += r.verdict + "\n";
  for (const auto& c : r.checks)
    if (!c.performance.empty()) o += c.performance + "\n";
  for (const auto& n : r.notes) o += n + "\n";
  if (!r.diagnosis.empty()) o += r.diagnosis + "\n";
  if (!r.pass && !r.ranking.empty()) {
    o += "ranking (distance = max over steps and micro-batches of |weight - "
         "predicted| / uncertainty):\n";
    for (size_t i = 0; i < r.ranking.size() && int(i) < top; ++i) {
      const auto& c = r.ranking[i];
      o += fmt::format("  {:>2}. {:<52} {:>10}  {}\n", i + 1, c.name,
                       fmt_ratio(c.distance), c.first_out_what);
    }
  }
  return o;
}

}  // namespace accumcheck
