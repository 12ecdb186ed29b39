// The reduction bound gamma_n * sum|terms| (oracle/tracked.hpp) against
// float32 sums where every addition rounds the same way: 1.0f followed by
// n terms of 2^-24 (1 + 2^-10), just above half an ulp of 1, so each
// addition rounds up by nearly half an ulp (or 2^-24 (1 - 2^-10): each
// rounds down), and the error grows by about u per term, the worst case
// the bound is built for.  For n = 10..1000 the float32 error must stay
// inside the bound (a gamma_n that is too small fails) and use at least
// the tolerance table's bound_tightness of it (a gamma_n inflated by more
// than 4x fails).  Random data (tests/oracle_tracked_test.cpp) never gets
// near either edge.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "oracle/error_model.hpp"
#include "oracle/tracked.hpp"

namespace accumcheck {
namespace {

using TR = Tracked<OracleReal>;
namespace em = error_model;

struct Adversary {
  const char* name;
  float head;  // the first term
  float term;  // each of the n terms after it
};

// 2^-24 (1 +- 2^-10): float32-exact, just above (below) half an ulp of 1.
const float kUp = std::ldexp(1.0f + std::ldexp(1.0f, -10), -24);
const float kDown = std::ldexp(1.0f - std::ldexp(1.0f, -10), -24);
const Adversary kAdversaries[] = {
    {"1 + n * (just above half an ulp): every addition rounds up", 1.0f, kUp},
    {"1 + n * (just below half an ulp): every addition rounds down", 1.0f,
     kDown},
    {"-1 - n * (just above half an ulp): every addition rounds away", -1.0f,
     -kUp},
};

// The terms in the order a float32 loop adds them.
std::vector<float> terms(const Adversary& a, int n) {
  std::vector<float> t(size_t(n) + 1, a.term);
  t[0] = a.head;
  return t;
}

// Checks f against the Tracked bound of the same reduction: inside it, and
// using at least bound_tightness of it.  Returns err / bound.
double judge(const std::string& what, float f, const TR& tracked) {
  const em::Comparison c =
      em::compare(what, std::vector<float>{f}, std::vector<TR>{tracked});
  EXPECT_TRUE(c.ok()) << c.summary();
  EXPECT_GE(c.max_ratio, em::tolerance("bound_tightness"))
      << c.summary() << ": the bound is looser than "
      << 1 / em::tolerance("bound_tightness") << "x the worst float32 rounding";
  return c.max_ratio;
}

TEST(ErrorModelAdversarial, SumEveryAdditionRoundingTheSameWay) {
  for (const Adversary& a : kAdversaries) {
    double lo = 1, hi = 0;
    for (int n = 10; n <= 1000; ++n) {
      const std::vector<float> x = terms(a, n);
      // float32, left to right (what a sequential kernel does).
      float f = 0;
      for (float v : x) f += v;
      // The oracle's sum with its bound: m = n + 1 terms, gamma_n.
      std::vector<TR> t(x.begin(), x.end());
      TR sum;
      sum_into(sum, static_cast<const TR*>(nullptr), int64_t(t.size()),
               t.data(), 1);
      const double r = judge(
          std::string(a.name) + ", n = " + std::to_string(n) + ", sum", f, sum);
      lo = std::min(lo, r);
      hi = std::max(hi, r);
      if (::testing::Test::HasFailure()) return;
    }
    // Printed for the record: the fraction of the bound used.
    std::printf("%s: err/bound in [%.4f, %.4f]\n", a.name, lo, hi);
  }
}

TEST(ErrorModelAdversarial, DotEveryAdditionRoundingTheSameWay) {
  for (const Adversary& a : kAdversaries) {
    for (int n = 10; n <= 1000; n += 3) {
      const std::vector<float> x = terms(a, n);
      const std::vector<float> ones(x.size(), 1.0f);
      // float32 with FMA, left to right: products are exact, each fma
      // rounds the running sum once.
      float f = 0;
      for (size_t k = 0; k < x.size(); ++k) f = std::fma(x[k], ones[k], f);
      std::vector<TR> tx(x.begin(), x.end()), t1(ones.begin(), ones.end());
      TR dot;
      dot_into(dot, static_cast<const TR*>(nullptr), int64_t(tx.size()),
               tx.data(), 1, t1.data(), 1);
      judge(std::string(a.name) + ", n = " + std::to_string(n) + ", dot", f,
            dot);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The same sum with the head as the reduction's initial value (the
// backward's `+=` form: init + sum of the n terms).  The float32 engine may
// add the initial value first or last; first is the adversarial order.
TEST(ErrorModelAdversarial, SumWithInitialValue) {
  for (const Adversary& a : kAdversaries) {
    for (int n = 10; n <= 1000; n += 7) {
      float f = a.head;
      for (int k = 0; k < n; ++k) f += a.term;
      const TR init(a.head);
      const std::vector<TR> t(size_t(n), TR(a.term));
      TR sum;
      sum_into(sum, &init, int64_t(n), t.data(), 1);
      judge(std::string(a.name) + ", n = " + std::to_string(n) + ", init", f,
            sum);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace accumcheck
