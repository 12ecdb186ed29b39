// The side-by-side table of `accumcheck run`: one row per window, a block
// per run (reference | correct | [accepted] | trainer): mean loss over the
// window, lr and gradient norm of the window's last optimizer step, and
// the relative parameter distance to the large-batch reference.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "sim/experiment.hpp"

namespace accumcheck::cli {

struct WindowCells {
  double loss = kNaN, lr = kNaN, grad_norm = kNaN;
  int64_t steps = 0;
};

template <class Real>
WindowCells cells(const Run<Real>& r, size_t w) {
  WindowCells c;
  if (w < r.windows.size()) {
    c.loss = r.windows[w].loss;
    c.steps = r.windows[w].steps;
  }
  for (const auto& s : r.steps)
    if (s.window == int64_t(w)) {
      c.lr = s.lr;
      c.grad_norm = s.grad_norm;
    }
  return c;
}

inline std::string cell(double v, int width, const char* fmt = "%.4g") {
  char buf[64];
  if (v != v)
    std::snprintf(buf, sizeof buf, "%*s", width, "-");
  else {
    char num[48];
    std::snprintf(num, sizeof num, fmt, v);
    std::snprintf(buf, sizeof buf, "%*s", width, num);
  }
  return buf;
}

// Which windows to print: all up to `max_rows`, else the first and last
// ones and an even sample between them.
inline std::vector<size_t> rows_to_print(size_t windows, size_t max_rows) {
  std::vector<size_t> rows;
  if (windows <= max_rows) {
    for (size_t w = 0; w < windows; ++w) rows.push_back(w);
    return rows;
  }
  const size_t head = max_rows / 2, tail = max_rows / 4;
  for (size_t w = 0; w < head; ++w) rows.push_back(w);
  const size_t mid = max_rows - head - tail;
  for (size_t i = 1; i <= mid; ++i)
    rows.push_back(head + (windows - head - tail) * i / (mid + 1));
  for (size_t w = windows - tail; w < windows; ++w) rows.push_back(w);
  return rows;
}

template <class Real>
std::string side_by_side(const Experiment<Real>& x, size_t max_rows) {
  struct Block {
    const Run<Real>* run;
    const std::vector<double>* dist;
  };
  std::vector<Block> blocks = {{&x.reference, nullptr},
                               {&x.correct, &x.correct_distance}};
  if (x.accepted) blocks.push_back({&*x.accepted, &x.accepted_distance});
  blocks.push_back({&x.trainer, &x.trainer_distance});

  constexpr int kW = 10;
  std::string out;
  // Header line 1: run names, each centred over its block.
  out += std::string(7, ' ');
  for (const Block& b : blocks) {
    const int width = b.dist ? 4 * kW + 3 : 3 * kW + 2;
    std::string name = b.run->name;
    if (int(name.size()) > width) name = name.substr(0, size_t(width));
    const int pad = width - int(name.size());
    out += " | " + std::string(size_t(pad / 2), ' ') + name +
           std::string(size_t(pad - pad / 2), ' ');
  }
  out += "\n window";
  for (const Block& b : blocks) {
    out += " | ";
    char buf[128];
    std::snprintf(buf, sizeof buf, "%*s %*s %*s", kW, "loss", kW, "lr", kW,
                  "|grad|");
    out += buf;
    if (b.dist) {
      std::snprintf(buf, sizeof buf, " %*s", kW, "dist");
      out += buf;
    }
  }
  out += "\n";
  size_t last = 0;
  bool first = true;
  for (size_t w : rows_to_print(x.reference.windows.size(), max_rows)) {
    if (!first && w != last + 1) out += "    ...\n";
    first = false;
    last = w;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%7zu", w);
    out += buf;
    for (const Block& b : blocks) {
      const auto c = cells(*b.run, w);
      out.append(" | ").append(cell(c.loss, kW)).append(" ");
      out.append(cell(c.lr, kW)).append(" ").append(cell(c.grad_norm, kW));
      if (b.dist) out.append(" ").append(cell((*b.dist)[w], kW, "%.3g"));
    }
    out += "\n";
  }
  return out;
}

}  // namespace accumcheck::cli
