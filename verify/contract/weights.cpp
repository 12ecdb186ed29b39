// The contract tier's measured weights and a candidate's distance from
// them (verify/contract/detail.hpp): each step's weight of every
// micro-batch composed from the fits, with its uncertainty, and a
// prediction's distance, the largest |W - P| / uncertainty.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "oracle/error_model.hpp"
#include "verify/contract/detail.hpp"

namespace accumcheck::contract_detail {

// Per rank, W_t = beta W_{t-1} + sum_b a_b w_b e_{m(b)} (b over every
// rank's backward passes: DDP's all-reduce brings the others'),
// uncertainties alongside.
Measured compose(const ContractSection& c, const std::vector<double>& eps,
                 const std::vector<std::vector<double>>& step_bound) {
  Measured out;
  for (int64_t r = 0; r < c.ranks(); ++r) {
    out.W.emplace_back();
    out.U.emplace_back();
    auto& m = out;
    const auto& steps = c.steps[size_t(r)];
    for (size_t t = 0; t < steps.size(); ++t) {
      Weights W, U;
      const double bound = step_bound[size_t(r)][t];
      for (const auto& k : steps[t].coefs) {
        const double da = k.norm > 0 ? bound / k.norm : 0.0;
        if (k.backward < 0) {
          if (t == 0) continue;
          for (const auto& [j, w] : m.W[size_t(r)][t - 1]) {
            W[j] += k.a * w;
            U[j] +=
                da * std::abs(w) + std::abs(k.a) * m.U[size_t(r)][t - 1].at(j);
          }
        } else {
          const ContractBackward& b = c.backward[size_t(k.backward)];
          W[b.micro] += k.a * b.weight;
          U[b.micro] += da * std::abs(b.weight) +
                        std::abs(k.a * b.weight) * eps[size_t(k.backward)];
        }
      }
      m.W[size_t(r)].push_back(std::move(W));
      m.U[size_t(r)].push_back(std::move(U));
    }
  }
  return out;
}

Distance distance(const Measured& m, const Prediction& p,
                  const ContractSection& c) {
  Distance out;
  const size_t R = m.W.size();
  auto who = [&](size_t r) {
    return R > 1 ? fmt::format("rank {} ", r) : std::string();
  };
  // The residual: a weight out counts 1, its excess ratio at most this
  // much (an order past any weight's), so no single step outweighs the
  // count.
  constexpr double kResidualCap = 1e3;
  Residual res;
  for (size_t r = 0; r < R; ++r) {
    const auto& longer = p.P[r].size() > m.W[r].size() ? p.P[r] : m.W[r];
    for (size_t t = std::min(p.P[r].size(), m.W[r].size()); t < longer.size();
         ++t) {
      res.out += int64_t(longer[t].size());
      res.excess += kResidualCap * double(longer[t].size());
    }
  }
  for (size_t r = 0; r < R; ++r)
    if (p.P[r].size() != m.W[r].size()) {
      out.d = kInf;
      out.why = fmt::format("{}takes {} optimizer steps, the trace {}", who(r),
                            p.P[r].size(), m.W[r].size());
    }
  const double u = error_model::kUnitRoundoff32;
  for (size_t r = 0; r < R; ++r)
    for (size_t t = 0; t < std::min(p.P[r].size(), m.W[r].size()); ++t) {
      const Weights& P_t = p.P[r][t];
      const Weights& W_t = m.W[r][t];
      double top = 0;
      for (const auto& [j, w] : P_t) top = std::max(top, std::abs(w));
      for (int64_t j : keys_of(P_t, W_t)) {
        const double P = at_or_0(P_t, j), W = at_or_0(W_t, j);
        const double U = std::max(at_or_0(m.U[r][t], j), u * top);
        double rr = U > 0 ? std::abs(W - P) / U : (W == P ? 0 : kInf);
        std::string why;
        if (P != 0 && j < int64_t(c.micro.size()) &&
            p.version[r][t].at(j) != c.micro[size_t(j)].version) {
          rr = kInf;
          why = fmt::format(
              "{}takes g of micro-batch {} at parameter version {}, the trace "
              "at {}",
              who(r), j, p.version[r][t].at(j), c.micro[size_t(j)].version);
        }
        if (rr > 1) {
          ++res.out;
          res.excess += std::min(rr, kResidualCap);
        }
        if (rr > out.d && !(std::isinf(out.d) && out.step < 0)) {
          out = {rr, int64_t(t), j, why, {}};
          if (why.empty())
            out.why = fmt::format(
                "{}step {} micro-batch {}: weight {:.9g}, predicted {:.9g}",
                who(r), t, j, W, P);
        }
      }
    }
  out.residual = res;
  return out;
}

}  // namespace accumcheck::contract_detail
