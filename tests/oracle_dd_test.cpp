// The double-double backend of the Tracked bound (oracle/dd.hpp,
// `certify --bound-arith dd`): its functions against MPFR at 50 digits,
// and a whole Tracked pass (forward, backward, clip norm, optimizer step)
// in DD against the same pass in 50-digit MPFR: values and bounds agree to
// the table's dd_bound_rel, the DD bound is never below MPFR's by more than
// that, and the exact (dyadic) tier stays exact.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "oracle/dd.hpp"
#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle_test_util.hpp"

namespace accumcheck {
namespace {

using R = OracleReal;
namespace em = error_model;

R mp(const DD& x) { return R(x.hi) + R(x.lo); }

// Relative error of a DD result against the 50-digit value.
double rel(const DD& got, const R& want) {
  if (want == 0) return got.hi == 0 ? 0 : INFINITY;
  return static_cast<double>(R(abs(mp(got) - want) / abs(want)));
}

// Inputs with a nonzero low part, as the oracle's values have.
std::vector<DD> inputs(double lo, double hi, int n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> U(lo, hi);
  std::vector<DD> v;
  for (int i = 0; i < n; ++i) {
    const double h = U(rng);
    v.push_back(DD::quick_two_sum(h, h * 0x1p-60 * U(rng) / (hi - lo + 1)));
  }
  return v;
}

constexpr double kFnRel = 0x1p-99;  // DD-accurate (oracle/dd.hpp)

TEST(DD, ArithmeticMatchesMpfr) {
  const auto a = inputs(-1e3, 1e3, 500, 1), b = inputs(-7, 7, 500, 2);
  for (size_t i = 0; i < a.size(); ++i) {
    const R x = mp(a[i]), y = mp(b[i]);
    EXPECT_LE(rel(a[i] * b[i], x * y), kFnRel);
    EXPECT_LE(rel(a[i] / b[i], x / y), kFnRel);
    // Addition is accurate relative to the operands, not the sum.
    EXPECT_LE(static_cast<double>(
                  R(abs(mp(a[i] + b[i]) - (x + y)) / (abs(x) + abs(y)))),
              kFnRel);
    EXPECT_LE(rel(sqrt(abs(a[i])), R(sqrt(abs(x)))), kFnRel);
  }
  EXPECT_EQ(static_cast<float>(DD::raw(1.0 + 0x1p-24, 0x1p-80)),
            1.0f + 0x1p-23f);  // a float tie broken by lo
  EXPECT_EQ(static_cast<float>(DD::raw(1.0 + 0x1p-24, -0x1p-80)), 1.0f);
  EXPECT_TRUE(std::isinf((DD(1) / DD(0.0)).hi));
  EXPECT_TRUE(
      std::isinf((DD(std::numeric_limits<double>::infinity()) + DD(1)).hi));
}

TEST(DD, TranscendentalsMatchMpfr) {
  double worst = 0;
  for (const DD& x : inputs(-80, 80, 400, 3))
    worst = std::max(worst, rel(exp(x), R(exp(mp(x)))));
  for (const DD& x : inputs(-0.3, 0.3, 400, 4))
    worst = std::max(worst, rel(expm1(x), R(expm1(mp(x)))));
  for (const DD& x : inputs(1e-6, 1e6, 400, 5))
    worst = std::max(worst, rel(log(x), R(log(mp(x)))));
  for (const DD& x : inputs(0.5, 2, 400, 6))
    worst = std::max(worst, rel(log(x), R(log(mp(x)))) *
                                std::min(1.0, std::fabs(std::log(x.hi))));
  for (const DD& x : inputs(-45, 45, 400, 7))
    worst = std::max(worst, rel(tanh(x), R(tanh(mp(x)))));
  for (const DD& x : inputs(-1e-3, 1e-3, 200, 8))
    worst = std::max(worst, rel(tanh(x), R(tanh(mp(x)))));
  for (const DD& x : inputs(-11, 11, 400, 9))
    worst = std::max(worst, rel(erf(x), R(erf(mp(x)))));
  for (const DD& x : inputs(-1e-3, 1e-3, 200, 10))
    worst = std::max(worst, rel(erf(x), R(erf(mp(x)))));
  EXPECT_LE(worst, kFnRel);
  std::printf("DD functions: worst relative error %.3g (2^%.1f)\n", worst,
              std::log2(worst));
}

// One teacher-forced pass as certify runs it, in both number types.
template <class T>
std::pair<std::vector<T>, std::vector<T>> pass(const ModelSpec& m,
                                               const Dataset& d,
                                               const std::vector<float>& p,
                                               OptimizerKind opt) {
  Oracle<T> o(m, d, p);
  o.zero_grad();
  o.forward_backward(oracle_test::iota_ids(0, 5), 8);
  o.forward_backward(oracle_test::iota_ids(5, 3), 8);
  const T norm = o.grad_norm();
  o.scale_grads(T(0.75) / (norm + T(1e-6)));
  std::vector<T> g = o.grads();
  OptimizerSpec os;
  os.kind = opt;
  os.momentum = 0.9;
  os.weight_decay = 0.01;
  o.optimizer_step(os, 0.01);
  o.optimizer_step(os, 0.01);
  return {g, o.params()};
}

struct Agreement {
  double value = 0;  // max |v_dd - v_mp| / e_mp
  double bound = 0;  // max |e_dd - e_mp| / e_mp
  double below = 0;  // max (e_mp - e_dd) / e_mp (DD bound smaller)
  int exact_mismatch = 0;
};

void agree(Agreement& a, const std::vector<Tracked<DD>>& dd,
           const std::vector<Tracked<R>>& m) {
  ASSERT_EQ(dd.size(), m.size());
  ASSERT_FALSE(dd.empty());
  for (size_t i = 0; i < dd.size(); ++i) {
    const R ve = mp(dd[i].v), ee = mp(dd[i].e);
    if (m[i].e == 0 || dd[i].e.hi == 0) {
      a.exact_mismatch += (m[i].e == 0) != (dd[i].e.hi == 0) || ve != m[i].v;
      continue;
    }
    a.value =
        std::max(a.value, static_cast<double>(R(abs(ve - m[i].v) / m[i].e)));
    a.bound =
        std::max(a.bound, static_cast<double>(R(abs(ee - m[i].e) / m[i].e)));
    a.below = std::max(a.below, static_cast<double>(R((m[i].e - ee) / m[i].e)));
  }
}

TEST(DD, TrackedPassAgreesWithMpfr) {
  const double tol = em::tolerance("dd_bound_rel");
  Agreement all;
  for (Activation act : {Activation::tanh, Activation::gelu, Activation::relu})
    for (LossKind loss : {LossKind::mse, LossKind::cross_entropy})
      for (OptimizerKind opt :
           {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw}) {
        const ModelSpec m = oracle_test::mlp({6, 12, 4}, act, loss);
        const Dataset d = oracle_test::dataset(m, 8, 11);
        const auto p = oracle_test::params(m, 12);
        const auto [gd, pd] = pass<Tracked<DD>>(m, d, p, opt);
        const auto [gm, pm] = pass<Tracked<R>>(m, d, p, opt);
        Agreement a;
        agree(a, gd, gm);
        agree(a, pd, pm);
        const std::string what = "activation " + std::to_string(int(act)) +
                                 " loss " + std::to_string(int(loss)) +
                                 " optimizer " + std::to_string(int(opt));
        EXPECT_LE(a.value, tol) << what;
        EXPECT_LE(a.bound, tol) << what;
        EXPECT_LE(a.below, tol) << what;
        EXPECT_EQ(a.exact_mismatch, 0) << what;
        all.value = std::max(all.value, a.value);
        all.bound = std::max(all.bound, a.bound);
        all.below = std::max(all.below, a.below);
      }
  std::printf(
      "DD vs MPFR pass: values within %.3g e, bounds within %.3g "
      "(below MPFR's by at most %.3g)\n",
      all.value, all.bound, all.below);
}

TEST(DD, DyadicPassStaysExact) {
  const ModelSpec m =
      oracle_test::mlp({4, 8, 2}, Activation::relu, LossKind::mse);
  const Dataset d = oracle_test::dataset(m, 8, 3, true);
  const auto p = oracle_test::params(m, 4, true);
  Oracle<Tracked<DD>> o(m, d, p);
  o.forward_backward(oracle_test::iota_ids(0, 4), 8);
  int64_t exact = 0;
  for (const auto& g : o.grads()) exact += g.e.hi == 0;
  EXPECT_GT(exact, 0);
  Oracle<Tracked<R>> om(m, d, p);
  om.forward_backward(oracle_test::iota_ids(0, 4), 8);
  for (size_t i = 0; i < o.grads().size(); ++i)
    EXPECT_EQ(o.grads()[i].e.hi == 0, om.grads()[i].e == 0) << i;
}

}  // namespace
}  // namespace accumcheck
