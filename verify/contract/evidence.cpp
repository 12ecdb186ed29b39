// The contract tier's model-free evidence (verify/contract/detail.hpp): when
// no semantics of the catalog fits, the measured weights of the first step that
// leaves `correct`, read as simple fractions of correct's 1/N_w.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "oracle/error_model.hpp"
#include "verify/contract/detail.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::contract_detail {

std::vector<std::string> contract_evidence(
    const ContractSection& c, const std::vector<std::map<int64_t, double>>& W,
    const std::vector<std::map<int64_t, double>>& U,
    const std::vector<std::map<int64_t, double>>& correct, int64_t K,
    const std::string& accepted) {
  const double tol = error_model::tolerance("evidence_weight_rel");
  const double u = error_model::kUnitRoundoff32;
  std::vector<std::string> out;
  if (W.size() != correct.size())
    out.push_back(fmt::format(
        "{} optimizer steps; {} takes {}", W.size(),
        accepted == "correct" ? std::string("correct accumulation") : accepted,
        correct.size()));
  auto near = [&](double a, double b) {
    return std::abs(a - b) <= tol * std::abs(b);
  };
  // The micro-batches a step of the trace holds: weight above what reads
  // as 0 (a fitted beta*G_prev leaves the previous step's keys near 0).
  auto held = [&](size_t t, double top) {
    std::vector<int64_t> js;
    for (const auto& [j, w] : W[t])
      if (std::abs(w) > tol * top) js.push_back(j);
    return js;
  };
  auto list = [](const std::vector<int64_t>& js) {
    return fmt::format("{}{}",
                       js.size() > 1 ? "micro-batches " : "micro-batch ",
                       fmt::join(js, ", "));
  };
  // What the trace's step t holds where it is not the accepted window.
  auto alone_text = [&](size_t t, double top) {
    const std::vector<int64_t> js = held(t, top);
    std::vector<int64_t> want;
    for (const auto& [j, p] : correct[t]) want.push_back(j);
    if (js == want) return std::string();
    return fmt::format("; the trace's step {} holds {}{}", t,
                       js.empty() ? std::string("no micro-batch") : list(js),
                       js.size() == 1 && want.size() > 1
                           ? " alone (a window of one micro-batch)"
                           : "");
  };
  // A micro-batch of the accepted window that weighs 0 in step t: where
  // the trace stepped it instead (alone: a window of one micro-batch), or
  // that it is in no step.
  auto elsewhere = [&](int64_t j, size_t t, double nw) {
    std::string at;
    for (size_t o = 0; o < W.size(); ++o) {
      if (o == t) continue;
      const auto it = W[o].find(j);
      if (it == W[o].end() || std::abs(it->second) * nw <= tol) continue;
      std::vector<int64_t> with = held(o, 1 / nw);
      with.erase(std::remove(with.begin(), with.end(), j), with.end());
      at += fmt::format(
          "{}step {} {}, weighing {:.6g}/N_w there", at.empty() ? "" : "; ", o,
          with.empty() ? std::string("alone") : "with " + list(with),
          it->second * nw);
    }
    return at.empty()
               ? fmt::format(
                     "micro-batch {} weighs 0/N_w: in no optimizer "
                     "step (skipped)",
                     j)
               : fmt::format("micro-batch {} is not in step {}: stepped at {}",
                             j, t, at);
  };
  for (size_t t = 0; t < std::min(W.size(), correct.size()); ++t) {
    double top = 0;
    for (const auto& [j, p] : correct[t]) top = std::max(top, std::abs(p));
    // The step leaves the accepted semantics by the verdict's own measure:
    // a weight further from its prediction than its uncertainty.
    bool differs = false;
    for (int64_t j : keys_of(W[t], correct[t])) {
      const double w = at_or_0(W[t], j), p = at_or_0(correct[t], j);
      const double un =
          std::max(t < U.size() ? at_or_0(U[t], j) : 0.0, u * top);
      if (std::abs(w - p) > un) differs = true;
    }
    if (!differs) continue;
    const double nw = top > 0 ? 1 / top : 0;  // correct's N_w
    out.push_back(fmt::format(
        "step {} is the first whose weights leave {}'s by more than their "
        "uncertainty (its window: N_w = {:.6g} items){}",
        t, accepted, nw, alone_text(t, top)));
    std::vector<double> ratios;
    for (const auto& [j, p] : correct[t])
      ratios.push_back((W[t].count(j) ? W[t].at(j) : 0.0) * nw);
    // Every weight the same multiple of correct's: with R ranks and a
    // multiple of R, the ranks' gradients summed and never divided by the
    // world size (a hand-written all_reduce(SUM) without the / R).
    bool uniform = !ratios.empty() && std::abs(ratios.front()) > tol;
    for (double x : ratios) uniform = uniform && near(x, ratios.front());
    if (uniform && held(t, top).size() == correct[t].size()) {
      const double x = ratios.front();
      const double R = double(c.ranks());
      out.push_back(fmt::format(
          "every weight is {:.6g} x correct's{}", x,
          c.ranks() > 1 && near(x, R)
              ? fmt::format(": the {} ranks' gradients summed and not "
                            "divided by the world size (all_reduce(SUM) "
                            "without / {})",
                            c.ranks(), c.ranks())
              : ""));
    }
    bool geometric = ratios.size() >= 2 && std::abs(ratios.back()) > tol;
    for (size_t i = 0; geometric && i + 1 < ratios.size(); ++i)
      geometric = near(ratios[i], 2 * ratios[i + 1]);
    size_t i = 0;
    for (const auto& [j, p] : correct[t]) {
      const double x = ratios[i++];
      const double w = x / nw;
      std::string what;
      if (geometric)
        what = "";
      else if (std::abs(x) <= tol) {
        out.push_back(elsewhere(j, t, nw));
        continue;
      } else if (near(x, 2))
        what = ": counted twice";
      else if (j < int64_t(c.micro.size()) &&
               near(w, 1.0 / (double(K) * double(c.micro[size_t(j)].items))))
        what = ": weight 1/(K*b_k), the micro-batch's own mean / K";
      out.push_back(
          fmt::format("micro-batch {} weighs {:.6g}/N_w{}", j, x, what));
    }
    if (geometric)
      out.push_back(
          "weights halve from one micro-batch to the next: geometric 2^(K-1-i) "
          "(the accumulator rescaled by 2 every micro-step: buf = 2*buf + g)");
    for (const auto& [j, w] : W[t])
      if (!correct[t].count(j) && std::abs(w) > tol * top) {
        const bool prev = t > 0 && correct[t - 1].count(j);
        out.push_back(fmt::format(
            "micro-batch {} weighs {:.6g}/N_w but belongs to no "
            "window of this step{}",
            j, w * nw, prev ? ": the previous window leaked in" : ""));
      }
    break;
  }
  return out;
}

}  // namespace accumcheck::contract_detail
