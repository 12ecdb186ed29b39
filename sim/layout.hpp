// Flat parameter arenas with named views.
//
// Parameters, gradients and optimizer state of every engine are one flat
// array each, laid out by ParamLayout: tensor after tensor, PyTorch names
// and layouts (nn.Sequential of Linear and activation modules, so Linear
// l is "{2l}.weight" [out x in], row-major, and "{2l}.bias" [out]).  One
// zeroing, one copy, one comparison loop that reports by tensor name.
//
// Normalization and dropout modules take their own Sequential index, as
// in PyTorch: Linear, [BatchNorm1d | LayerNorm | GroupNorm], activation,
// [Dropout],
// Linear, ...  so with a norm the first hidden block is "0.weight",
// "0.bias", "1.weight", "1.bias" (the norm's affine) and BatchNorm's
// running statistics "1.running_mean", "1.running_var" are BUFFERS: a
// separate arena (engine state and traces, never parameters: no
// gradient, no optimizer).  The token model is "0.weight" (the
// embedding, [vocab x embed]) and the Linear "1.weight", "1.bias".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

struct TensorView {
  std::string name;  // "0.weight"
  int64_t rows = 0;  // weight: out features; bias: out features
  int64_t cols = 1;  // weight: in features; bias: 1
  int64_t offset = 0;
  int64_t fan_in = 0;  // for PyTorch's default init bound 1/sqrt(fan_in)
  // PyTorch's init: uniform +-1/sqrt(fan_in) (Linear; the embedding uses
  // fan_in 1), ones (norm weight, running_var), zeros (norm bias,
  // running_mean).
  enum class Init { uniform, ones, zeros } init = Init::uniform;
  int64_t size() const { return rows * cols; }
};

struct ParamLayout {
  std::vector<TensorView> tensors;
  int64_t total = 0;

  // Buffers (BatchNorm running statistics), their own flat arena.
  std::vector<TensorView> buffers;
  int64_t buffer_total = 0;
  // Indices into `tensors`: Linear l's weight (its bias follows), hidden
  // layer l's norm weight (its bias follows), the embedding (-1: none).
  // Empty `linear`: the plain layout, Linear l at 2l.
  std::vector<size_t> linear, norm;
  int64_t embedding = -1;

  // Linear layer l's weight and bias views.
  const TensorView& weight(size_t l) const {
    return tensors[linear.empty() ? 2 * l : linear[l]];
  }
  const TensorView& bias(size_t l) const {
    return tensors[(linear.empty() ? 2 * l : linear[l]) + 1];
  }
  size_t layers() const {
    return linear.empty() ? tensors.size() / 2 : linear.size();
  }
  // Hidden layer l's norm affine (norm layouts only).
  const TensorView& norm_weight(size_t l) const { return tensors[norm[l]]; }
  const TensorView& norm_bias(size_t l) const { return tensors[norm[l] + 1]; }
  // Hidden layer l's running statistics (BatchNorm only).
  const TensorView& running_mean(size_t l) const { return buffers[2 * l]; }
  const TensorView& running_var(size_t l) const { return buffers[2 * l + 1]; }
  // The tensor holding flat index i (for error messages).
  const TensorView& tensor_of(int64_t i) const {
    for (const TensorView& t : tensors)
      if (i < t.offset + t.size()) return t;
    return tensors.back();
  }
};

ParamLayout layout_of(const ModelSpec& m);

// How a norm layer groups the elements of a [rows x cols] activation:
// G groups of E elements, element k of group g at x[g*gs + k*es].
//   BatchNorm1d: a group is a feature over the rows (G = cols, E = rows,
//     gs = 1, es = cols);
//   LayerNorm / GroupNorm(ng): a group is ng-th of a row, E = cols / ng
//     consecutive features (G = rows * ng, gs = E, es = 1); LayerNorm is
//     ng = 1.
// `row_groups` is ng (0 for BatchNorm): element (r, c) is in group
// r * ng + c / E, and element k of group g is feature (g % ng) * E + k.
struct NormGeometry {
  int64_t G = 0, E = 0, gs = 0, es = 0;
  int64_t row_groups = 0;
  bool batch() const { return row_groups == 0; }
};

inline NormGeometry norm_geometry(const ModelSpec& m, int64_t rows,
                                  int64_t cols) {
  if (m.norm == NormKind::batchnorm) return {cols, rows, 1, cols, 0};
  const int64_t ng = m.norm == NormKind::groupnorm ? m.norm_groups : 1;
  const int64_t E = cols / ng;
  return {rows * ng, E, E, 1, ng};
}

// Initial buffers: running_mean 0, running_var 1 (PyTorch).
inline std::vector<float> initial_buffers(const ParamLayout& L) {
  std::vector<float> b(size_t(L.buffer_total), 0.0f);
  for (const TensorView& v : L.buffers)
    if (v.init == TensorView::Init::ones)
      for (int64_t k = 0; k < v.size(); ++k) b[size_t(v.offset + k)] = 1.0f;
  return b;
}

}  // namespace accumcheck
