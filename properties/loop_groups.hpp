// The step groupings the window and framework-loop properties predict
// with (properties/loop_properties.cpp,
// properties/framework_loop_properties.cpp): each epoch's micro-batches,
// a plan's windows, a list of micro-batches' parts weighted by a
// denominator, and the check that each step of a run sums its group.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "properties/generators.hpp"
#include "properties/harness.hpp"

namespace accumcheck::properties {

using Micro = std::vector<const MicroBatch*>;
// (micro-batches, epoch) per optimizer step.
using Groups = std::vector<std::pair<Micro, int64_t>>;

// Each epoch's micro-batches in order.
inline std::vector<Micro> epoch_micro(const Plan& p) {
  std::vector<Micro> out;
  for (const EpochPlan& e : p.epochs) {
    out.emplace_back();
    for (const Window& w : e.windows)
      for (const MicroBatch& m : w.micro) out.back().push_back(&m);
  }
  return out;
}

// The plan's windows, each with its epoch (pointing into `full`).
inline Groups plan_windows(const Plan& full) {
  Groups out;
  for (size_t e = 0; e < full.epochs.size(); ++e)
    for (const Window& w : full.epochs[e].windows) {
      Micro ms;
      for (const MicroBatch& m : w.micro) ms.push_back(&m);
      out.push_back({ms, int64_t(e)});
    }
  return out;
}

inline Parts weighted(const Micro& ms,
                      const std::function<int64_t(int64_t)>& den) {
  Parts ps;
  for (const MicroBatch* m : ms)
    for (const auto& sh : m->shards)
      if (!sh.empty()) ps.push_back({sh, den(int64_t(sh.size()))});
  return ps;
}

inline int64_t ranks_of(const MicroBatch& m) {
  return int64_t(m.shards.size());
}

// Each step of `bug` sums exactly groups[i], each item of a shard of b
// items weighted 1/den(group, b), at the parameters before the step.
inline void check_groups(
    const std::string& name, const Case& c, const Run<R>& bug,
    const Groups& groups,
    const std::function<int64_t(const Micro&, int64_t b)>& den,
    const char* what) {
  RC_ASSERT(bug.steps.size() == groups.size());
  for (size_t i = 0; i < bug.steps.size(); ++i) {
    const Micro& g = groups[i].first;
    const auto want = predicted(
        c, theta_before(bug, i, c),
        weighted(g, [&](int64_t b) { return den(g, b); }), groups[i].second);
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(), what);
  }
}

// The summed item count of a list of micro-batches (every rank's shard).
inline int64_t items_of(const Micro& g) {
  int64_t N = 0;
  for (const MicroBatch* m : g) N += m->items();
  return N;
}

// Each of `bug`'s steps sums its parts' gradients (steps[i]: step i's
// parts, each with the epoch it was drawn in, predicted with that epoch),
// every item of a part weighted 1/den(steps[i], part).
inline void check_step_parts(
    const std::string& name, const Case& c, const Run<R>& bug,
    const std::vector<Groups>& steps,
    const std::function<int64_t(const Groups&, const Micro&)>& den,
    const char* what) {
  RC_ASSERT(bug.steps.size() == steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<R> theta = theta_before(bug, i, c);
    std::vector<R> want;
    for (const auto& [part, e] : steps[i]) {
      const int64_t N = den(steps[i], part);
      const std::vector<R> g =
          predicted(c, theta, weighted(part, [N](int64_t) { return N; }), e);
      if (want.empty()) want.assign(g.size(), R(0));
      for (size_t j = 0; j < g.size(); ++j) want[j] += g[j];
    }
    assert_close(name, bug.steps[i].grad, want, oracle_tolerance(), what);
  }
}

// check_step_parts' denominators: each part's own items, or the whole
// step's (all its parts, whichever epoch each was drawn in).
inline int64_t own_items(const Groups&, const Micro& part) {
  return items_of(part);
}
inline int64_t step_items(const Groups& step, const Micro&) {
  int64_t N = 0;
  for (const auto& [part, e] : step) N += items_of(part);
  return N;
}

}  // namespace accumcheck::properties
