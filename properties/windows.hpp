// Windows of a plan in run order, and per-sample weights over them: the
// helpers the oracle properties (properties/properties.cpp,
// properties/ramp_properties.cpp) build their predictions with.
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

struct FlatWindow {
  const Window* w = nullptr;
  int64_t epoch = 0;
  bool last_of_epoch = false;
  int64_t epoch_micro_steps = 0;
  int64_t micro_before = 0;  // micro-steps of the whole run before it
};

inline std::vector<FlatWindow> flatten(const Plan& p) {
  std::vector<FlatWindow> out;
  int64_t micro = 0;
  for (size_t e = 0; e < p.epochs.size(); ++e) {
    const auto& ws = p.epochs[e].windows;
    for (size_t i = 0; i < ws.size(); ++i) {
      out.push_back({&ws[i], int64_t(e), i + 1 == ws.size(),
                     p.epochs[e].micro_steps(), micro});
      micro += int64_t(ws[i].micro.size());
    }
  }
  return out;
}

// Per-sample weights 1/den for the micro-batches [from, to) of a window.
inline Parts parts(const Window& w, size_t from, size_t to,
                   const std::function<int64_t(int64_t shard_items)>& den) {
  Parts ps;
  for (size_t k = from; k < to && k < w.micro.size(); ++k)
    for (const auto& sh : w.micro[k].shards)
      if (!sh.empty()) ps.push_back({sh, den(int64_t(sh.size()))});
  return ps;
}
inline Parts all_parts(const Window& w,
                       const std::function<int64_t(int64_t)>& den) {
  return parts(w, 0, w.micro.size(), den);
}

inline int64_t ranks(const Window& w) {
  return int64_t(w.micro.front().shards.size());
}

// Each step's gradient equals the per-sample-weight prediction at the
// buggy run's own parameters.
inline void check_weights(
    const std::string& name, const Case& c, const Run<R>& bug,
    const std::function<Parts(const FlatWindow&)>& parts_of) {
  const auto windows = flatten(c.plan);
  RC_ASSERT(!bug.steps.empty());
  for (size_t t = 0; t < bug.steps.size(); ++t) {
    const FlatWindow& fw = windows[size_t(bug.steps[t].window)];
    const auto want = predicted(c, theta_before(bug, t, c), parts_of(fw));
    assert_close(name, bug.steps[t].grad, want, oracle_tolerance(),
                 "predicted gradient");
  }
}

inline Triggers gradient_triggers(std::vector<Pitfall> pitfalls) {
  Triggers t;
  t.pitfalls = std::move(pitfalls);
  t.no_clip = true;          // the prediction is of the raw gradient
  t.no_weight_decay = true;  // no L2 term in the loss
  return t;
}

}  // namespace accumcheck::properties
