// The coefficient-engine check of properties/contract_properties.cpp,
// exposed for the tests that break it on purpose.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "properties/harness.hpp"
#include "sim/pitfalls.hpp"

namespace accumcheck::properties {

// The micro-batch gradients g_j of one case, shared by the semantics checked
// on it: predicted(c, theta, {{ids, 1}}, epoch) depends on nothing but the
// case and those three, so a g_j at the same parameters (bit for bit: every
// semantics' first window is at the initial ones, and a pitfall that changes
// nothing in a scenario leaves correct's trajectory) is computed once.
class MicroGrads {
 public:
  explicit MicroGrads(const Case& c) : c_(c) {}
  const std::vector<R>& get(const std::vector<R>& theta,
                            const std::vector<int64_t>& ids, int64_t epoch);
  // The loss-bearing items of `ids` (one oracle for every semantics).
  int64_t items(const std::vector<int64_t>& ids);

 private:
  struct Entry {
    std::vector<R> theta, grad;
  };
  const Case& c_;
  std::unique_ptr<O> items_;
  // Per (ids, epoch), the parameters seen and their gradient (a deque's
  // push_back moves no element: a returned reference stays valid).
  std::map<std::pair<std::vector<int64_t>, int64_t>, std::deque<Entry>> seen_;
};

// The worst relative distance, over the optimizer steps of the oracle run
// of `sem`, between the step's gradient and the coefficient engine's
// weights times independently computed g_j.  break_on_purpose doubles the
// weight of the first term of every step (the check must then fail).
// `grads` (null: a fresh one) holds the g_j computed for the case so far.
double coefficient_check(const Case& c, const std::vector<Pitfall>& sem,
                         bool break_on_purpose = false,
                         MicroGrads* grads = nullptr);

}  // namespace accumcheck::properties
