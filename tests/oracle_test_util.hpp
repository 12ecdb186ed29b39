// Hand-built datasets and parameters for the oracle tests (sim/data.cpp's
// generator is not needed: the engine takes any float32-exact Dataset).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "sim/data.hpp"
#include "sim/layout.hpp"
#include "sim/scenario.hpp"

namespace accumcheck::oracle_test {

inline ModelSpec mlp(std::vector<int64_t> widths, Activation act,
                     LossKind loss) {
  ModelSpec m;
  m.widths = std::move(widths);
  m.activation = act;
  m.loss = loss;
  return m;
}

// n samples, inputs and targets uniform in [-1, 1] rounded to float32
// (dyadic: multiples of 1/8, so every product is exact).
inline Dataset dataset(const ModelSpec& m, int64_t n, uint32_t seed,
                       bool dyadic = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> U(-1, 1);
  auto draw = [&] {
    const double x = U(rng);
    return dyadic ? float(std::round(x * 8) / 8) : float(x);
  };
  Dataset d;
  d.n = n;
  d.d_in = m.d_in();
  d.d_out = m.d_out();
  d.loss = m.loss;
  for (int64_t i = 0; i < n * d.d_in; ++i) d.x.push_back(draw());
  if (m.loss == LossKind::mse)
    for (int64_t i = 0; i < n * d.d_out; ++i) d.y.push_back(draw());
  else
    for (int64_t i = 0; i < n; ++i)
      d.label.push_back(int32_t(rng() % uint32_t(d.d_out)));
  return d;
}

// PyTorch-like: uniform in +-1/sqrt(fan_in), float32 (dyadic: n/8 scaled).
inline std::vector<float> params(const ModelSpec& m, uint32_t seed,
                                 bool dyadic = false) {
  const ParamLayout L = layout_of(m);
  std::mt19937 rng(seed);
  std::vector<float> p;
  for (const TensorView& t : L.tensors) {
    const double bound = 1.0 / std::sqrt(double(t.fan_in));
    std::uniform_real_distribution<double> U(-bound, bound);
    for (int64_t i = 0; i < t.size(); ++i) {
      const double x = U(rng);
      p.push_back(dyadic ? float(std::round(x * 8) / 8) : float(x));
    }
  }
  return p;
}

inline std::vector<int64_t> iota_ids(int64_t from, int64_t count) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(from + i);
  return ids;
}

}  // namespace accumcheck::oracle_test
