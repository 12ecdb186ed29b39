// NullEngine: an engine that does no tensor math.  Trainer<NullEngine>
// walks a plan under any semantics and yields exactly the call pattern
// (events), the optimizer steps and the lr of each, at no cost: none of
// those depend on values except a clip's decision, which only scales.
// Export uses it for the lr per step; certify for expected step counts
// and call patterns.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/engine.hpp"
#include "sim/trainer.hpp"

namespace accumcheck {

struct NullEngine {
  using Real = double;
  // Sample counts: the pattern and the steps do not depend on the
  // weights, so token counts are not needed here.
  int64_t items(const std::vector<int64_t>& ids) const {
    return int64_t(ids.size());
  }
  void zero_grad() {}
  double forward_backward(const std::vector<int64_t>&, LossWeight) { return 0; }
  void add_l2(double, int64_t) {}
  double grad_norm() const { return 0; }
  void scale_grads(double) {}
  void optimizer_step(const OptimizerSpec&, double) {}
  EngineState<double> state() const { return {}; }
  void set_state(const EngineState<double>&) {}
};

static_assert(Engine<NullEngine>);

// Compiled once, in verify/export/export.cpp, not again in every unit that
// runs a plan through it (docs/development.md "Build": the cold build's
// CPU).
extern template class Trainer<NullEngine>;

}  // namespace accumcheck
