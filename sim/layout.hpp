// Flat parameter arenas with named views.
//
// Parameters, gradients and optimizer state of every engine are one flat
// array each, laid out by ParamLayout: tensor after tensor, PyTorch names
// and layouts (nn.Sequential of Linear and activation modules, so Linear
// l is "{2l}.weight" [out x in], row-major, and "{2l}.bias" [out]).  One
// zeroing, one copy, one comparison loop that reports by tensor name.
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
  int64_t size() const { return rows * cols; }
};

struct ParamLayout {
  std::vector<TensorView> tensors;
  int64_t total = 0;

  // Linear layer l's weight and bias views.
  const TensorView& weight(size_t l) const { return tensors[2 * l]; }
  const TensorView& bias(size_t l) const { return tensors[2 * l + 1]; }
  size_t layers() const { return tensors.size() / 2; }
  // The tensor holding flat index i (for error messages).
  const TensorView& tensor_of(int64_t i) const {
    for (const TensorView& t : tensors)
      if (i < t.offset + t.size()) return t;
    return tensors.back();
  }
};

inline ParamLayout layout_of(const ModelSpec& m) {
  ParamLayout L;
  for (size_t l = 0; l + 1 < m.widths.size(); ++l) {
    const int64_t in = m.widths[l], out = m.widths[l + 1];
    const std::string prefix = std::to_string(2 * l);
    L.tensors.push_back({prefix + ".weight", out, in, L.total, in});
    L.total += out * in;
    L.tensors.push_back({prefix + ".bias", out, 1, L.total, in});
    L.total += out;
  }
  return L;
}

}  // namespace accumcheck
