#include "sim/layout.hpp"

#include <string>
#include <utility>

namespace accumcheck {

ParamLayout layout_of(const ModelSpec& m) {
  using Init = TensorView::Init;
  ParamLayout L;
  auto add = [&L](std::string name, int64_t rows, int64_t cols, int64_t fan_in,
                  Init init = Init::uniform) {
    L.tensors.push_back({std::move(name), rows, cols, L.total, fan_in, init});
    L.total += rows * cols;
  };
  auto add_buffer = [&L](std::string name, int64_t rows, Init init) {
    L.buffers.push_back({std::move(name), rows, 1, L.buffer_total, 0, init});
    L.buffer_total += rows;
  };
  if (m.kind == ModelKind::token) {
    // widths = {embed, vocab}.
    L.embedding = 0;
    add("0.weight", m.widths.back(), m.widths.front(), 1);
    L.linear.push_back(L.tensors.size());
    add("1.weight", m.widths.back(), m.widths.front(), m.widths.front());
    add("1.bias", m.widths.back(), 1, m.widths.front());
    return L;
  }
  int64_t module = 0;
  for (size_t l = 0; l + 1 < m.widths.size(); ++l) {
    const int64_t in = m.widths[l], out = m.widths[l + 1];
    const std::string prefix = std::to_string(module++);
    L.linear.push_back(L.tensors.size());
    add(prefix + ".weight", out, in, in);
    add(prefix + ".bias", out, 1, in);
    if (l + 2 == m.widths.size()) break;  // no activation after the last
    if (m.norm != NormKind::none) {
      const std::string n = std::to_string(module++);
      L.norm.push_back(L.tensors.size());
      add(n + ".weight", out, 1, 1, Init::ones);
      add(n + ".bias", out, 1, 1, Init::zeros);
      if (m.norm == NormKind::batchnorm) {
        add_buffer(n + ".running_mean", out, Init::zeros);
        add_buffer(n + ".running_var", out, Init::ones);
      }
    }
    ++module;                     // the activation
    if (m.dropout > 0) ++module;  // nn.Dropout
  }
  return L;
}

}  // namespace accumcheck
