// The contract tier's model-free evidence (verify/contract/detail.hpp): when
// no semantics of the catalog fits, the measured weights of the first step that
// leaves `correct`, read as simple fractions of correct's 1/N_w.
#include <fmt/format.h>

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
    const std::vector<std::map<int64_t, double>>& correct, int64_t K) {
  const double tol = error_model::tolerance("evidence_weight_rel");
  std::vector<std::string> out;
  if (W.size() != correct.size())
    out.push_back(
        fmt::format("{} optimizer steps; correct accumulation takes {}",
                    W.size(), correct.size()));
  auto near = [&](double a, double b) {
    return std::abs(a - b) <= tol * std::abs(b);
  };
  for (size_t t = 0; t < std::min(W.size(), correct.size()); ++t) {
    double top = 0;
    for (const auto& [j, p] : correct[t]) top = std::max(top, std::abs(p));
    bool differs = W[t].size() != correct[t].size();
    for (const auto& [j, w] : W[t]) {
      auto it = correct[t].find(j);
      if (it == correct[t].end() ? std::abs(w) > tol * top
                                 : !near(w, it->second))
        differs = true;
    }
    if (!differs) continue;
    const double nw = top > 0 ? 1 / top : 0;  // correct's N_w
    out.push_back(fmt::format(
        "step {} is the first to leave correct (N_w = {:.6g} items)", t, nw));
    std::vector<double> ratios;
    for (const auto& [j, p] : correct[t])
      ratios.push_back((W[t].count(j) ? W[t].at(j) : 0.0) * nw);
    // Every weight the same multiple of correct's: with R ranks and a
    // multiple of R, the ranks' gradients summed and never divided by the
    // world size (a hand-written all_reduce(SUM) without the / R).
    bool uniform = !ratios.empty() && std::abs(ratios.front()) > tol;
    for (double x : ratios) uniform = uniform && near(x, ratios.front());
    if (uniform && W[t].size() == correct[t].size()) {
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
      else if (std::abs(x) <= tol)
        what = ": skipped";
      else if (near(x, 2))
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
