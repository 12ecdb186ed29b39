// The dataset every engine trains on, float32-exact.
//
// Generated data is a pure function of (scenario seed, sample id), so any
// micro-batching of any K or rank count sees identical values; initial
// parameters are a pure function of (seed, tensor, element).  CSV data
// (a file the scenario names) is read once and rounded once to float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/layout.hpp"
#include "sim/scenario.hpp"

namespace accumcheck {

struct Dataset {
  int64_t n = 0, d_in = 0, d_out = 0;
  LossKind loss = LossKind::mse;
  uint64_t seed = 0;               // the scenario seed (dropout masks)
  std::vector<float> x;            // n x d_in, row-major
  std::vector<float> y;            // mse: n x d_out targets
  std::vector<int32_t> label;      // cross_entropy: n class ids in [0, d_out)
  std::vector<std::string> notes;  // e.g. "values rounded to float32"
  // Token models: n sequences of max_len positions, row-major.  tokens in
  // [0, vocab) (0 at padding); targets in [0, vocab), or kIgnoreIndex at
  // every padding position (the padding mask); length = loss-bearing
  // tokens per sequence (>= 1).
  static constexpr int32_t kIgnoreIndex = -100;
  int64_t max_len = 0;
  std::vector<int32_t> tokens, token_targets, length;

  const float* input(int64_t i) const { return x.data() + i * d_in; }
  const float* target(int64_t i) const { return y.data() + i * d_out; }
};

// Generated or read from the scenario's CSV; throws ScenarioError (with
// file and line) on a bad CSV.
Dataset make_dataset(const Scenario& s);

// The length of generated sequence `id` (token models), a pure function
// of (seed, id) and the [data] length distribution.
int64_t sequence_length(const DataSpec& d, int64_t id);

// PyTorch-like initial parameters: uniform in +-1/sqrt(fan_in), rounded to
// float32 (dyadic mode: n/8 scaled by a power of two, exact).
std::vector<float> initial_parameters(const Scenario& s,
                                      const ParamLayout& layout);

}  // namespace accumcheck
