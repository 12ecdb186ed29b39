// The error model: float32 computations done with plain float stay within
// the Tracked bound, and the bound is not absurdly loose.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle_test_util.hpp"

namespace accumcheck {
namespace {

using oracle_test::dataset;
using oracle_test::mlp;
using oracle_test::params;
using R = OracleReal;
using TR = Tracked<R>;
namespace em = error_model;

// err / bound for one float result; fails the test if outside.
double ratio(float f, const TR& t, const std::string& what) {
  const R err = R(abs(R(f) - t.v));
  EXPECT_LE(err, t.e) << what << ": f=" << f << " v=" << t.v
                      << " bound=" << t.e;
  if (t.e == 0) return err == 0 ? 0 : INFINITY;
  return static_cast<double>(R(err / t.e));
}

std::vector<float> uniform(std::mt19937& rng, int n) {
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = U(rng);
  return v;
}

// Four summation orders a BLAS might use, with and without FMA.
std::vector<float> float_dots(const std::vector<float>& a,
                              const std::vector<float>& b, float init) {
  const size_t n = a.size();
  float fwd = 0, rev = 0, fma = 0;
  for (size_t k = 0; k < n; ++k) fwd += a[k] * b[k];
  for (size_t k = n; k-- > 0;) rev += a[k] * b[k];
  for (size_t k = 0; k < n; ++k) fma = std::fma(a[k], b[k], fma);
  std::vector<float> pw(n);
  for (size_t k = 0; k < n; ++k) pw[k] = a[k] * b[k];
  for (size_t w = 1; w < n; w *= 2)
    for (size_t k = 0; k + w < n; k += 2 * w) pw[k] += pw[k + w];
  return {fwd + init, init + rev, fma + init, (n ? pw[0] : 0.0f) + init};
}

TEST(TrackedDot, FloatOrdersWithinBoundAndBoundIsTight) {
  std::mt19937 rng(7);
  double max_ratio = 0;
  for (int n : {1, 2, 3, 10, 100, 1000}) {
    for (int trial = 0; trial < 40; ++trial) {
      const auto a = uniform(rng, n), b = uniform(rng, n);
      const float init = uniform(rng, 1)[0];
      std::vector<TR> ta(a.begin(), a.end()), tb(b.begin(), b.end());
      const TR tinit(init);
      TR d;
      dot_into(d, &tinit, n, ta.data(), 1, tb.data(), 1);
      for (float f : float_dots(a, b, init))
        max_ratio =
            std::max(max_ratio, ratio(f, d, "dot n=" + std::to_string(n)));
    }
  }
  EXPECT_GT(max_ratio, em::tolerance("bound_min_use"));
  EXPECT_LE(max_ratio, 1.0);
}

// Inputs that are themselves float results (a = x * y in float): the
// propagated part of the bound.
TEST(TrackedDot, PropagatesInputErrors) {
  std::mt19937 rng(8);
  double max_ratio = 0;
  for (int trial = 0; trial < 100; ++trial) {
    const int n = 1 + int(rng() % 50);
    const auto x = uniform(rng, n), y = uniform(rng, n), b = uniform(rng, n);
    std::vector<float> a(static_cast<size_t>(n));
    std::vector<TR> ta, tb(b.begin(), b.end());
    for (int k = 0; k < n; ++k) {
      a[size_t(k)] = x[size_t(k)] * y[size_t(k)];
      ta.push_back(TR(x[size_t(k)]) * TR(y[size_t(k)]));
    }
    TR d;
    dot_into(d, static_cast<const TR*>(nullptr), n, ta.data(), 1, tb.data(), 1);
    for (float f : float_dots(a, b, 0.0f))
      max_ratio = std::max(max_ratio, ratio(f, d, "dot of products"));
  }
  EXPECT_GT(max_ratio, em::tolerance("bound_min_use"));
}

TEST(TrackedDot, DyadicDataIsExactWithZeroBound) {
  std::vector<TR> a = {TR(0.5f), TR(-1.25f), TR(3.0f)};
  std::vector<TR> b = {TR(2.0f), TR(0.75f), TR(-0.125f)};
  TR d;
  dot_into(d, static_cast<const TR*>(nullptr), 3, a.data(), 1, b.data(), 1);
  EXPECT_EQ(d.e, 0);
  EXPECT_EQ(d.v, R(1) - R(0.9375) - R(0.375));
  // Not exact once the partial sums need more than 24 bits.
  std::vector<TR> c = {TR(1.0f), TR(std::ldexp(1.0f, -30))};
  std::vector<TR> one = {TR(1.0f), TR(1.0f)};
  dot_into(d, static_cast<const TR*>(nullptr), 2, c.data(), 1, one.data(), 1);
  EXPECT_GT(d.e, 0);
}

TEST(TrackedOps, ElementwiseAndTranscendentalsWithinBound) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> U(-3, 3);
  double max_ratio = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const float x = U(rng), y = U(rng), z = U(rng);
    const float fp = x * y;  // an input with an error
    const TR tp = TR(x) * TR(y);
    auto check = [&](float f, const TR& t, const char* what) {
      max_ratio = std::max(max_ratio, ratio(f, t, what));
    };
    check(fp + z, tp + TR(z), "add");
    check(fp * z, tp * TR(z), "mul");
    check(fp / z, tp / TR(z), "div");
    check(z / fp, TR(z) / tp, "div by inexact");
    check(std::sqrt(std::fabs(fp)), sqrt(abs(tp)), "sqrt");
    check(std::exp(fp), exp(tp), "exp");
    check(std::log(std::fabs(fp) + 0.5f), log(abs(tp) + TR(0.5f)), "log");
    check(std::tanh(fp), tanh(tp), "tanh");
    check(std::erf(fp), erf(tp), "erf");
    check(fp > 0 ? fp : 0.0f, branch_positive(tp, tp, TR(0.0f)), "relu");
    check(float(0.1), TR(0.1), "hyperparameter");
  }
  EXPECT_GT(max_ratio, 0.1);
}

// A small MLP's forward (tanh, mse) in a plain float loop of the test's
// own, against the Tracked oracle's loss.
TEST(TrackedMlp, ForwardFloatLoopWithinBound) {
  const ModelSpec m = mlp({4, 8, 3}, Activation::tanh, LossKind::mse);
  double max_ratio = 0;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const Dataset d = dataset(m, 5, 100 + seed);
    const std::vector<float> p = params(m, 200 + seed);
    const ParamLayout L = layout_of(m);
    float total = 0;
    for (int64_t i = 0; i < d.n; ++i) {
      std::vector<float> h(8), y(3);
      for (int o = 0; o < 8; ++o) {
        float s = 0;
        for (int k = 0; k < 4; ++k)
          s += p[size_t(L.weight(0).offset + o * 4 + k)] * d.input(i)[k];
        h[size_t(o)] = std::tanh(s + p[size_t(L.bias(0).offset + o)]);
      }
      float l = 0;
      for (int o = 0; o < 3; ++o) {
        float s = p[size_t(L.bias(1).offset + o)];
        for (int k = 0; k < 8; ++k)
          s += p[size_t(L.weight(1).offset + o * 8 + k)] * h[size_t(k)];
        const float diff = s - d.target(i)[o];
        l += diff * diff;
      }
      total += l / 3.0f;
    }
    Oracle<TR> o(m, d, p);
    const TR loss = o.loss(oracle_test::iota_ids(0, d.n));
    max_ratio = std::max(max_ratio, ratio(total, loss, "mlp forward loss"));
  }
  EXPECT_GT(max_ratio, em::tolerance("bound_min_use"));
}

// One whole pass, teacher forced from a float32-exact state: K uneven
// micro-batches accumulated with +=, clipping, one optimizer step, done by
// a float32 engine (Oracle<float>: the same formulas in float) and by the
// Tracked oracle; every element within the bound.
struct PassCase {
  Activation act;
  LossKind loss;
  OptimizerKind opt;
  bool clip;
};

double check_pass(const PassCase& c, uint32_t seed) {
  const ModelSpec m =
      mlp({5, 8, 6, c.loss == LossKind::mse ? 3 : 4}, c.act, c.loss);
  const Dataset d = dataset(m, 9, seed);
  const std::vector<float> p0 = params(m, seed + 1);
  Oracle<float> f(m, d, p0);
  Oracle<TR> t(m, d, p0);
  OptimizerSpec opt;
  opt.kind = c.opt;
  opt.momentum = c.opt == OptimizerKind::sgd ? 0.9 : 0.0;
  opt.weight_decay = 0.01;
  // A state from earlier steps (float32-exact): optimizer buffers, step 4.
  std::mt19937 rng(seed + 2);
  std::uniform_real_distribution<float> U(0, 0.01f);
  EngineState<float> s0 = f.state();
  s0.optimizer_steps = 4;
  for (size_t i = 0; i < s0.params.size(); ++i) {
    s0.exp_avg.push_back(U(rng) - 0.005f);
    if (c.opt != OptimizerKind::sgd) s0.exp_avg_sq.push_back(U(rng) * U(rng));
  }
  f.set_state(s0);
  t.set_state(lift_state<TR>(s0));

  const std::vector<std::vector<int64_t>> micro = {
      {0, 1, 2, 3}, {4, 5}, {6, 7, 8}};
  f.zero_grad();
  t.zero_grad();
  for (const auto& ids : micro) {
    f.forward_backward(ids, 9);
    t.forward_backward(ids, 9);
  }
  const ParamLayout& L = t.layout();
  std::string name = std::to_string(int(c.act)) + "/" +
                     std::to_string(int(c.loss)) + "/" +
                     std::to_string(int(c.opt));
  em::Comparison g =
      em::compare("grads " + name, f.state().grads, t.state().grads, &L);
  EXPECT_TRUE(g.ok()) << g.summary();
  double max_ratio = g.max_ratio;
  if (c.clip) {
    // The trainer's clip, in each engine's arithmetic, with the threshold
    // far from the decision (max_norm = half the norm).
    const double max_norm = 0.5 * static_cast<double>(t.grad_norm());
    const float fn = f.grad_norm();
    const float fcoef = float(max_norm) / (fn + float(1e-6));
    const TR tn = t.grad_norm();
    const TR tcoef = TR(max_norm) / (tn + TR(1e-6));
    EXPECT_LE(R(abs(R(fn) - tn.v)), tn.e);
    EXPECT_LT(fcoef, 1.0f);
    EXPECT_LT(tcoef, TR(1));
    f.scale_grads(fcoef);
    t.scale_grads(tcoef);
    em::Comparison cg = em::compare("clipped grads " + name, f.state().grads,
                                    t.state().grads, &L);
    EXPECT_TRUE(cg.ok()) << cg.summary();
    max_ratio = std::max(max_ratio, cg.max_ratio);
  }
  const double lr = c.opt == OptimizerKind::sgd ? 0.1 : 1e-3;
  f.optimizer_step(opt, lr);
  t.optimizer_step(opt, lr);
  em::Comparison pc =
      em::compare("params " + name, f.state().params, t.state().params, &L);
  EXPECT_TRUE(pc.ok()) << pc.summary();
  em::Comparison mc =
      em::compare("exp_avg " + name, f.state().exp_avg, t.state().exp_avg, &L);
  EXPECT_TRUE(mc.ok()) << mc.summary();
  return std::max({max_ratio, pc.max_ratio, mc.max_ratio});
}

void check_passes(PassCase c) {
  double max_ratio = 0;
  for (uint32_t seed = 0; seed < 5; ++seed)
    max_ratio = std::max(max_ratio, check_pass(c, 1000 + 10 * seed));
  ::testing::Test::RecordProperty("max_bound_use", std::to_string(max_ratio));
  std::printf("  largest error / bound: %.3g\n", max_ratio);
  EXPECT_GT(max_ratio, em::tolerance("bound_min_use"));
}

TEST(TrackedPass, TanhMseSgdMomentumClip) {
  check_passes({Activation::tanh, LossKind::mse, OptimizerKind::sgd, true});
}
TEST(TrackedPass, ReluMseAdam) {
  check_passes({Activation::relu, LossKind::mse, OptimizerKind::adam, false});
}
TEST(TrackedPass, GeluCrossEntropyAdamWClip) {
  check_passes(
      {Activation::gelu, LossKind::cross_entropy, OptimizerKind::adamw, true});
}
TEST(TrackedPass, TanhCrossEntropyAdamClip) {
  check_passes(
      {Activation::tanh, LossKind::cross_entropy, OptimizerKind::adam, true});
}
TEST(TrackedPass, IdentityMseSgd) {
  check_passes(
      {Activation::identity, LossKind::mse, OptimizerKind::sgd, false});
}

// Dyadic data, linear model, mse, den a power of two: every operation is
// exact, the bound is 0, and float32 matches exactly.
TEST(TrackedPass, DyadicLinearMseIsExact) {
  const ModelSpec m = mlp({3, 2}, Activation::identity, LossKind::mse);
  const Dataset d = dataset(m, 4, 77, /*dyadic=*/true);
  const std::vector<float> p = params(m, 78, true);
  Oracle<float> f(m, d, p);
  Oracle<TR> t(m, d, p);
  f.zero_grad();
  t.zero_grad();
  f.forward_backward({0, 1}, 4);
  t.forward_backward({0, 1}, 4);
  f.forward_backward({2, 3}, 4);
  t.forward_backward({2, 3}, 4);
  for (const TR& g : t.state().grads) EXPECT_EQ(g.e, 0);
  em::Comparison c = em::compare("dyadic grads", f.state().grads,
                                 t.state().grads, &t.layout());
  EXPECT_TRUE(c.ok()) << c.summary();
  EXPECT_EQ(c.max_err_u, 0);
}

TEST(ErrorModelCompare, ZeroBoundDemandsEquality) {
  std::vector<TR> v = {TR::exact(R(1)), TR(R(2), R(1e-6))};
  em::Comparison ok = em::compare("x", {1.0f, 2.0f}, v);
  EXPECT_TRUE(ok.ok()) << ok.summary();
  em::Comparison bad = em::compare("x", {std::nextafter(1.0f, 2.0f), 2.0f}, v);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.worst.index, 0);
  EXPECT_TRUE(std::isinf(bad.worst.ratio));
  em::Comparison size = em::compare("x", {1.0f}, v);
  EXPECT_FALSE(size.ok());
  const ParamLayout L =
      layout_of(mlp({1, 1}, Activation::identity, LossKind::mse));
  em::Comparison named = em::compare("p", {1.0f, 2.5f}, v, &L);
  EXPECT_EQ(named.worst.tensor, "0.bias[0]");
  EXPECT_NE(named.summary().find("0.bias[0]"), std::string::npos);
}

TEST(ErrorModelCompare, ToleranceTableHasReasons) {
  for (const em::Tolerance& t : em::kTolerances) EXPECT_FALSE(t.reason.empty());
  EXPECT_EQ(em::tolerance("bound_slack"), 1.0);
  EXPECT_THROW(em::tolerance("nope"), std::out_of_range);
}

}  // namespace
}  // namespace accumcheck
