// Shared by the tests that check a Trainer result against a value computed
// by hand outside it (tests/pitfall_catalog_test.cpp,
// tests/second_guard_test.cpp).
#pragma once

#include <vector>

#include "oracle/oracle.hpp"
#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/trainer.hpp"

namespace accumcheck::hole_test {

using R = OracleReal;

// The gradient handed to the first optimizer step of the correct trainer
// (after any clipping), on the 50-digit oracle; empty when no step is
// taken.
inline std::vector<R> first_step_gradient(const Scenario& s, const Dataset& d,
                                          const std::vector<float>& params) {
  Oracle<R> o(s.model, d, params);
  TrainerOptions opt;
  opt.max_steps = 1;
  Trainer<Oracle<R>> t(o, s, behavior_of({}), base_lr(s), opt);
  auto run = t.run(make_plan(s), "correct");
  if (run.steps.empty()) return {};
  return std::move(run.steps[0].grad);
}

// max_i |got_i - want_i| / max_i |want_i| (infinite when the sizes differ
// or want is all zero), for a comparison at the oracle tolerance.
inline double max_relative_difference(const std::vector<R>& got,
                                      const std::vector<R>& want) {
  if (got.size() != want.size()) return INFINITY;
  R worst(0), scale(0);
  for (size_t i = 0; i < got.size(); ++i) {
    if (scale < R(abs(want[i]))) scale = R(abs(want[i]));
    if (worst < R(abs(R(got[i] - want[i]))))
      worst = R(abs(R(got[i] - want[i])));
  }
  if (scale == 0) return INFINITY;
  return static_cast<double>(R(worst / scale));
}

}  // namespace accumcheck::hole_test
