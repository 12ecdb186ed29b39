// Each candidate semantics' prediction (verify/contract/detail.hpp): the
// plan the trainer drew, the coefficient engine (coefficient_engine.hpp)
// run through the one Trainer loop on it, and the gradient all-reduces of
// a predicted run against the trace's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "sim/errors.hpp"
#include "sim/trainer.hpp"
#include "verify/contract/coefficient_engine.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck {
template class Trainer<contract::CoefficientEngine>;
}  // namespace accumcheck

namespace accumcheck::contract_detail {

namespace {

// Step -> the micro-step (within the window) after whose backward each
// of its gradient all-reduces ran, of a predicted run's events.
Reduces all_reduces(const std::vector<Event>& events) {
  Reduces out;
  for (const Event& ev : events)
    if (ev.kind == EventKind::all_reduce) out[ev.step].push_back(ev.micro);
  return out;
}

// The symbols' values of a predicted run: a clip's, the factor the
// trainer's k-th clip_grad_norm_ call at the same parameter version applied
// (1 where the trainer made no such call: then the accepted loop's clip is
// judged by the clip check, not here); a mean's, from the clips'.
std::vector<double> clip_symbols(const contract::CoefficientEngine& e,
                                 const ContractSection& c) {
  std::vector<double> factor;
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
    factor.push_back(v);
  }
  return contract::symbol_values<double>(
      e.symbols(),
      [&](size_t m, const std::vector<double>&) { return factor[m]; });
}

}  // namespace

ContractPlan contract_plan(const ContractSection& c, int64_t K,
                           const std::string& path) {
  ContractPlan p;
  p.drawn = int64_t(c.micro.size());
  for (const auto& m : c.micro) {
    p.stride = std::max(p.stride, m.samples + 1);
    p.micro_batch = std::max(p.micro_batch, m.samples);
    p.items.push_back(m.items);
    p.unshifted.push_back(m.unshifted);
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
        p.unshifted.push_back(-1);
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

Prediction predict(const ContractPlan& cp, const Scenario& s, const Behavior& b,
                   const ContractSection& c) {
  contract::CoefficientEngine e(
      [&](const std::vector<int64_t>& ids) {
        int64_t n = 0;
        std::set<int64_t> seen;
        for (int64_t id : ids)
          if (seen.insert(id / cp.stride).second)
            n += cp.items[size_t(id / cp.stride)];
        return n;
      },
      // token-count-unshifted-labels: the recorded unshifted count, or
      // (not recorded) the items and each sequence's position 0.
      [&](const std::vector<int64_t>& ids) {
        std::map<int64_t, int64_t> rows;
        for (int64_t id : ids) ++rows[id / cp.stride];
        int64_t n = 0;
        for (const auto& [m, k] : rows)
          n += cp.unshifted[size_t(m)] >= 0 ? cp.unshifted[size_t(m)]
                                            : cp.items[size_t(m)] + k;
        return n;
      });
  Trainer<contract::CoefficientEngine> t(e, s, b, 1.0,
                                         TrainerOptions::values_unrecorded());
  const Run<double> run = t.run(cp.plan, "prediction");
  const std::vector<double> sym = clip_symbols(e, c);
  Prediction p;
  p.reduces = all_reduces(run.events);
  for (const auto& clip : e.clips()) ++p.clips[{clip.rank, clip.version}];
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
  // The drawn micro-batches backwarded but in no step.
  std::set<int64_t> stepped;
  for (const auto& rank : p.P)
    for (const Weights& w : rank)
      for (const auto& [m, v] : w) stepped.insert(m);
  for (const auto& mg : e.micro()) {
    const int64_t m = mg.ids.front() / cp.stride;
    if (m < cp.drawn && !stepped.count(m)) p.unstepped_backward.insert(m);
  }
  // A window the trace's loss scaler skipped (or stepped on inf or NaN):
  // its micro-batches are in no step of any semantics (the loss scaler
  // check judges the window itself).
  for (size_t r = 0; r < p.P.size() && r < c.steps.size(); ++r)
    for (size_t t = 0; t < p.P[r].size() && t < c.steps[r].size(); ++t)
      if (c.steps[r][t].overflow) {
        p.P[r][t].clear();
        p.version[r][t].clear();
      }
  return p;
}

std::string unstepped_differ(const ContractPlan& cp, const ContractSection& c,
                             const Prediction& pred) {
  std::set<int64_t> stepped, backwarded;
  for (const auto& rank : pred.P)
    for (const Weights& w : rank)
      for (const auto& [m, v] : w) stepped.insert(m);
  for (const auto& b : c.backward) backwarded.insert(b.micro);
  for (int64_t m = 0; m < cp.drawn; ++m) {
    if (stepped.count(m)) continue;
    const bool trace = backwarded.count(m) > 0;
    if (trace != (pred.unstepped_backward.count(m) > 0))
      return fmt::format(
          "micro-batch {} (in no step): the trace {} it, this loop {}", m,
          trace ? "backwards" : "never backwards",
          trace ? "never backwards it" : "backwards it");
  }
  return "";
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

}  // namespace accumcheck::contract_detail
