// The oracle engine: backward against finite differences, the += contract,
// the optimizers against PyTorch's formulas, state round trips.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle_test_util.hpp"

namespace accumcheck {
namespace {

using oracle_test::dataset;
using oracle_test::iota_ids;
using oracle_test::mlp;
using oracle_test::params;
using R = OracleReal;

static_assert(Engine<Oracle<OracleReal>>);
static_assert(Engine<Oracle<Tracked<OracleReal>>>);

R rabs(const R& x) { return R(abs(x)); }

// Backward vs central finite differences of the oracle's own forward:
// d/dp (sum_i l_i) / den  ~  (L(p + h) - L(p - h)) / (2 h den).
void check_backward(const ModelSpec& m) {
  const Dataset d = dataset(m, 6, 11);
  Oracle<R> o(m, d, params(m, 12));
  const std::vector<int64_t> ids = {0, 2, 3, 5, 1};
  const int64_t den = 7;
  o.zero_grad();
  o.forward_backward(ids, den);
  const std::vector<R> g = o.grads();
  const R h(error_model::tolerance("fd_step"));
  R gmax(0), worst(0);
  int64_t worst_i = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (gmax < rabs(g[i])) gmax = rabs(g[i]);
    const R p = o.params()[i];
    o.params()[i] = p + h;
    const R lp = o.loss(ids);
    o.params()[i] = p - h;
    const R lm = o.loss(ids);
    o.params()[i] = p;
    const R fd = (lp - lm) / (2 * h * den);
    const R diff = rabs(fd - g[i]);
    if (worst < diff) worst = diff, worst_i = int64_t(i);
  }
  ASSERT_GT(gmax, 0);
  EXPECT_LE(worst / gmax, R(error_model::tolerance("fd_rel")))
      << "worst at " << o.layout().tensor_of(worst_i).name << " flat "
      << worst_i << ": |fd - g| = " << static_cast<double>(worst);
}

TEST(OracleBackward, LinearMse) {
  check_backward(mlp({3, 2}, Activation::identity, LossKind::mse));
}
TEST(OracleBackward, MlpIdentityMse) {
  check_backward(mlp({3, 5, 4, 2}, Activation::identity, LossKind::mse));
}
TEST(OracleBackward, MlpTanhMse) {
  check_backward(mlp({3, 5, 4, 2}, Activation::tanh, LossKind::mse));
}
TEST(OracleBackward, MlpReluMse) {
  check_backward(mlp({3, 5, 4, 2}, Activation::relu, LossKind::mse));
}
TEST(OracleBackward, MlpGeluMse) {
  check_backward(mlp({3, 5, 4, 2}, Activation::gelu, LossKind::mse));
}
TEST(OracleBackward, MlpTanhCrossEntropy) {
  check_backward(mlp({3, 5, 4, 3}, Activation::tanh, LossKind::cross_entropy));
}
TEST(OracleBackward, MlpReluCrossEntropy) {
  check_backward(mlp({3, 5, 4, 3}, Activation::relu, LossKind::cross_entropy));
}
TEST(OracleBackward, MlpGeluCrossEntropy) {
  check_backward(mlp({3, 6, 4}, Activation::gelu, LossKind::cross_entropy));
}
TEST(OracleBackward, LinearCrossEntropy) {
  check_backward(mlp({4, 3}, Activation::identity, LossKind::cross_entropy));
}

// The loss value: mse is the mean over outputs, cross-entropy -log softmax.
TEST(OracleLoss, MseAndCrossEntropyByHand) {
  const ModelSpec m = mlp({1, 2}, Activation::identity, LossKind::mse);
  Dataset d;
  d.n = 1, d.d_in = 1, d.d_out = 2, d.loss = LossKind::mse;
  d.x = {1.0f};
  d.y = {0.5f, -1.0f};
  // W = [2, 3]^T, b = [0.25, 0]: y = [2.25, 3]; diffs 1.75, 4.
  Oracle<R> o(m, d, {2.0f, 3.0f, 0.25f, 0.0f});
  EXPECT_EQ(o.loss({0}), (R(1.75) * R(1.75) + R(16)) / 2);

  const ModelSpec c =
      mlp({1, 2}, Activation::identity, LossKind::cross_entropy);
  Dataset e;
  e.n = 1, e.d_in = 1, e.d_out = 2, e.loss = LossKind::cross_entropy;
  e.x = {1.0f};
  e.label = {1};
  Oracle<R> q(c, e, {2.0f, 3.0f, 0.0f, 0.0f});
  const R expect = log(exp(R(2)) + exp(R(3))) - 3;
  EXPECT_LT(rabs(q.loss({0}) - expect), R(1e-45));
}

// backward twice into zeroed grads = exactly 2x backward once.
void check_twice(const ModelSpec& m) {
  const Dataset d = dataset(m, 5, 21);
  Oracle<R> o(m, d, params(m, 22));
  const auto ids = iota_ids(0, 5);
  o.zero_grad();
  const R l1 = o.forward_backward(ids, 3);
  const std::vector<R> g1 = o.grads();
  const R l2 = o.forward_backward(ids, 3);
  EXPECT_EQ(l1, l2);
  for (size_t i = 0; i < g1.size(); ++i)
    ASSERT_EQ(o.grads()[i], 2 * g1[i]) << "element " << i;
  o.zero_grad();
  for (const R& g : o.grads()) ASSERT_EQ(g, 0);
}

TEST(OracleAccumulate, BackwardTwiceIsExactlyTwiceTanhMse) {
  check_twice(mlp({3, 4, 2}, Activation::tanh, LossKind::mse));
}
TEST(OracleAccumulate, BackwardTwiceIsExactlyTwiceGeluCrossEntropy) {
  check_twice(mlp({3, 4, 3}, Activation::gelu, LossKind::cross_entropy));
}

// Accumulating two halves with den = N equals one batch of N, to 50 digits.
TEST(OracleAccumulate, TwoMicroBatchesEqualOneBatchReluMse) {
  const ModelSpec m = mlp({3, 4, 2}, Activation::relu, LossKind::mse);
  const Dataset d = dataset(m, 6, 31);
  Oracle<R> a(m, d, params(m, 32)), b(m, d, params(m, 32));
  a.zero_grad();
  a.forward_backward(iota_ids(0, 6), 6);
  b.zero_grad();
  b.forward_backward(iota_ids(0, 2), 6);
  b.forward_backward(iota_ids(2, 4), 6);
  for (size_t i = 0; i < a.grads().size(); ++i)
    EXPECT_LT(rabs(a.grads()[i] - b.grads()[i]), R(1e-45)) << i;
}

TEST(OracleGrads, NormScaleAndL2) {
  const ModelSpec m = mlp({2, 1}, Activation::identity, LossKind::mse);
  const Dataset d = dataset(m, 2, 41);
  Oracle<R> o(m, d, {1.0f, -2.0f, 0.5f});
  EngineState<R> s = o.state();
  s.grads = {R(3), R(4), R(12)};
  o.set_state(s);
  EXPECT_EQ(o.grad_norm(), R(13));
  o.scale_grads(R(0.5));
  EXPECT_EQ(o.grads()[2], R(6));
  o.add_l2(0.5, 2);  // grads += 0.25 * params
  EXPECT_EQ(o.grads()[0], R(1.5) + R(0.25));
  EXPECT_EQ(o.grads()[1], R(2) - R(0.5));
  EXPECT_EQ(o.grads()[2], R(6) + R(0.125));
}

// ------------------------------------------------------------ optimizers

struct Case3 {
  std::vector<R> p = {R(0.5), R(-1.25), R(2)};
  std::vector<R> g = {R(0.1), R(0.2), R(-0.3)};
};

Oracle<R> three(const Case3& c, std::vector<R> grads) {
  const ModelSpec m = mlp({2, 1}, Activation::identity, LossKind::mse);
  Oracle<R> o(m, dataset(m, 1, 1), {0, 0, 0});
  EngineState<R> s = o.state();
  s.params = c.p;
  s.grads = std::move(grads);
  o.set_state(s);
  return o;
}

void expect_near(const std::vector<R>& got, const std::vector<R>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LT(rabs(got[i] - want[i]), R(1e-45) * (1 + rabs(want[i])))
        << "element " << i << ": " << got[i] << " vs " << want[i];
}

TEST(OracleOptimizer, SgdPlainWithWeightDecay) {
  Case3 c;
  Oracle<R> o = three(c, c.g);
  OptimizerSpec opt;
  opt.kind = OptimizerKind::sgd;
  opt.weight_decay = 0.01;
  o.optimizer_step(opt, 0.1);
  std::vector<R> want;
  for (int i = 0; i < 3; ++i)
    want.push_back(c.p[i] - R(0.1) * (c.g[i] + R(0.01) * c.p[i]));
  expect_near(o.state().params, want);
  EXPECT_EQ(o.state().optimizer_steps, 1);
  EXPECT_TRUE(o.state().exp_avg.empty());
}

TEST(OracleOptimizer, SgdMomentumFirstStepInitAndSecondStep) {
  Case3 c;
  Oracle<R> o = three(c, c.g);
  OptimizerSpec opt;
  opt.kind = OptimizerKind::sgd;
  opt.momentum = 0.9;
  o.optimizer_step(opt, 0.1);
  // Step 1: buf = g (no dampening), p -= lr * buf.
  std::vector<R> p1, buf;
  for (int i = 0; i < 3; ++i) {
    buf.push_back(c.g[i]);
    p1.push_back(c.p[i] - R(0.1) * c.g[i]);
  }
  expect_near(o.state().params, p1);
  expect_near(o.state().exp_avg, buf);
  // Step 2 with new grads g2: buf = 0.9 buf + g2.
  const std::vector<R> g2 = {R(-0.5), R(0.25), R(1)};
  EngineState<R> s = o.state();
  s.grads = g2;
  o.set_state(s);
  o.optimizer_step(opt, 0.05);
  std::vector<R> p2;
  for (int i = 0; i < 3; ++i) {
    buf[i] = R(0.9) * buf[i] + g2[i];
    p2.push_back(p1[i] - R(0.05) * buf[i]);
  }
  expect_near(o.state().params, p2);
  expect_near(o.state().exp_avg, buf);
  EXPECT_EQ(o.state().optimizer_steps, 2);
}

// PyTorch 1.13 Adam, by hand: bc1 = 1 - b1^t, bc2 = 1 - b2^t,
// p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
void adam_by_hand(std::vector<R>& p, std::vector<R>& m, std::vector<R>& v,
                  const std::vector<R>& g, int t, double lr, double wd,
                  bool decoupled) {
  const R b1(0.9), b2(0.999), eps(1e-8);
  const R bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
  for (size_t i = 0; i < p.size(); ++i) {
    R gi = g[i];
    if (decoupled)
      p[i] = p[i] * (1 - R(lr) * R(wd));
    else
      gi = gi + R(wd) * p[i];
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    p[i] = p[i] - (R(lr) / bc1) * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
  }
}

void check_adam(OptimizerKind kind, double wd) {
  Case3 c;
  Oracle<R> o = three(c, c.g);
  OptimizerSpec opt;
  opt.kind = kind;
  opt.weight_decay = wd;
  std::vector<R> p = c.p, m(3, R(0)), v(3, R(0));
  o.optimizer_step(opt, 1e-3);
  adam_by_hand(p, m, v, c.g, 1, 1e-3, wd, kind == OptimizerKind::adamw);
  expect_near(o.state().params, p);
  expect_near(o.state().exp_avg, m);
  expect_near(o.state().exp_avg_sq, v);
  const std::vector<R> g2 = {R(0.3), R(-0.1), R(0.05)};
  EngineState<R> s = o.state();
  s.grads = g2;
  o.set_state(s);
  o.optimizer_step(opt, 2e-3);
  adam_by_hand(p, m, v, g2, 2, 2e-3, wd, kind == OptimizerKind::adamw);
  expect_near(o.state().params, p);
  expect_near(o.state().exp_avg, m);
  expect_near(o.state().exp_avg_sq, v);
  EXPECT_EQ(o.state().optimizer_steps, 2);
}

TEST(OracleOptimizer, AdamSteps1And2) { check_adam(OptimizerKind::adam, 0); }
TEST(OracleOptimizer, AdamCoupledWeightDecaySteps1And2) {
  check_adam(OptimizerKind::adam, 0.1);
}
TEST(OracleOptimizer, AdamWSteps1And2) {
  check_adam(OptimizerKind::adamw, 0.1);
}

// ------------------------------------------------------------ state

template <class T>
void check_round_trip() {
  const ModelSpec m = mlp({3, 4, 2}, Activation::tanh, LossKind::mse);
  const Dataset d = dataset(m, 4, 51);
  Oracle<T> o(m, d, params(m, 52));
  o.zero_grad();
  o.forward_backward(iota_ids(0, 4), 4);
  OptimizerSpec opt;
  opt.kind = OptimizerKind::adam;
  o.optimizer_step(opt, 0.01);
  o.forward_backward(iota_ids(0, 2), 4);
  const EngineState<T> s = o.state();
  Oracle<T> q(m, d, params(m, 99));
  q.set_state(s);
  const EngineState<T> r = q.state();
  EXPECT_TRUE(r.params == s.params);
  EXPECT_TRUE(r.grads == s.grads);
  EXPECT_TRUE(r.exp_avg == s.exp_avg);
  EXPECT_TRUE(r.exp_avg_sq == s.exp_avg_sq);
  EXPECT_EQ(r.optimizer_steps, 1);
  // Both continue identically.
  o.optimizer_step(opt, 0.01);
  q.optimizer_step(opt, 0.01);
  EXPECT_TRUE(o.state().params == q.state().params);
}

TEST(OracleState, RoundTripOracleReal) { check_round_trip<R>(); }
TEST(OracleState, RoundTripTracked) { check_round_trip<Tracked<R>>(); }

TEST(OracleState, RejectsBadInput) {
  const ModelSpec m = mlp({3, 2}, Activation::tanh, LossKind::mse);
  const Dataset d = dataset(m, 4, 61);
  EXPECT_THROW(Oracle<R>(m, d, {1.0f}), std::invalid_argument);
  Oracle<R> o(m, d, params(m, 62));
  EngineState<R> s = o.state();
  s.params.pop_back();
  EXPECT_THROW(o.set_state(s), std::invalid_argument);
  EXPECT_THROW(o.forward_backward({4}, 1), std::out_of_range);
}

TEST(OracleDigits, SetDigitsChangesPrecision) {
  EXPECT_EQ(oracle_digits(), kDefaultOracleDigits);
  set_oracle_digits(80);
  const R third = R(1) / 3;
  EXPECT_GE(third.precision(), 80u);
  set_oracle_digits(kDefaultOracleDigits);
  EXPECT_THROW(set_oracle_digits(5), std::invalid_argument);
}

}  // namespace
// The double oracle's Linear kernels (oracle/layers.hpp: four outputs'
// sums at a time, the gradients a row at a time) against their
// definition, dot_into per output (oracle/real.hpp), bit for bit: odd
// sizes (remainders of four), one and several rows, signed zeros, dW
// accumulating into nonzero old values, and no input gradient.
TEST(OracleDouble, LinearKernelsAreTheSums) {
  std::mt19937_64 rng(17);
  auto value = [&rng] {
    const int r = int(rng() % 16);
    if (r == 0) return 0.0;
    if (r == 1) return -0.0;
    const double u = double(rng() >> 11) * 0x1p-53 - 0.5;
    return std::ldexp(u, int(rng() % 30) - 15);
  };
  auto fill = [&value](size_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = value();
    return v;
  };
  auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (std::bit_cast<uint64_t>(a[i]) != std::bit_cast<uint64_t>(b[i]))
        return false;
    return true;
  };
  int cases = 0;
  for (int64_t B : {1, 3, 4})
    for (int64_t in : {1, 5, 16, 33})
      for (int64_t out : {1, 3, 4, 7, 12}) {
        const auto inp = fill(size_t(B * in)), W = fill(size_t(out * in)),
                   bias = fill(size_t(out)), dout = fill(size_t(B * out)),
                   dW0 = fill(size_t(out * in)), db0 = fill(size_t(out));
        std::vector<double> y(size_t(B * out)), want_y(y.size());
        linear_forward(y.data(), inp.data(), W.data(), bias.data(), B, in, out);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t o = 0; o < out; ++o)
            dot_into(want_y[size_t(b * out + o)], &bias[size_t(o)], in,
                     &W[size_t(o * in)], 1, &inp[size_t(b * in)], 1);
        EXPECT_TRUE(same(y, want_y))
            << "forward B " << B << " in " << in << " out " << out;
        for (bool with_dinp : {true, false}) {
          std::vector<double> dinp(size_t(B * in), 7.0), dW = dW0, db = db0;
          linear_backward(with_dinp ? dinp.data() : nullptr, dW.data(),
                          db.data(), dout.data(), inp.data(), W.data(), B, in,
                          out);
          std::vector<double> want_dinp(dinp.size(), 7.0), want_dW = dW0,
                                                           want_db = db0;
          if (with_dinp)
            for (int64_t b = 0; b < B; ++b)
              for (int64_t i = 0; i < in; ++i)
                dot_into(want_dinp[size_t(b * in + i)],
                         static_cast<const double*>(nullptr), out,
                         &dout[size_t(b * out)], 1, &W[size_t(i)], in);
          for (int64_t o = 0; o < out; ++o)
            for (int64_t i = 0; i < in; ++i)
              dot_into(want_dW[size_t(o * in + i)],
                       &want_dW[size_t(o * in + i)], B, &dout[size_t(o)], out,
                       &inp[size_t(i)], in);
          for (int64_t o = 0; o < out; ++o)
            sum_into(want_db[size_t(o)], &want_db[size_t(o)], B,
                     &dout[size_t(o)], out);
          EXPECT_TRUE(same(dinp, want_dinp)) << "input grad B " << B;
          EXPECT_TRUE(same(dW, want_dW)) << "weight grad B " << B;
          EXPECT_TRUE(same(db, want_db)) << "bias grad B " << B;
          ++cases;
        }
      }
  EXPECT_EQ(cases, 120);
}

// The double oracle's Adam step (dd_lanes::adam_step on doubles, four
// elements in vector lanes) against adam_loop, the loop every other number type
// runs, bit for bit: Adam with and without coupled weight decay, AdamW, both
// flags, gradients from 0 to large, a NaN.
TEST(OracleDouble, AdamStepIsTheLoop) {
  std::mt19937_64 rng(23);
  auto value = [&rng](int spread) {
    const double u = double(rng() >> 11) * 0x1p-53 - 0.5;
    return std::ldexp(u, int(rng() % uint64_t(spread)) - spread / 2);
  };
  const int64_t n = 37;
  int cases = 0;
  for (int flags = 0; flags < 4; ++flags)
    for (int step = 1; step <= 3; ++step) {
      AdamScalars<double> s;
      s.beta1 = 0.9;
      s.beta2 = 0.999;
      s.one_minus_beta1 = double(1 - 0.9f);
      s.one_minus_beta2 = double(1 - 0.999f);
      s.step_size = 1e-3 / (1 - std::pow(0.9, step));
      s.bc2_sqrt = std::sqrt(1 - std::pow(0.999, step));
      s.eps = 1e-8;
      s.weight_decay = 0.01;
      s.decay = 1 - 1e-3 * 0.01;
      s.decoupled = flags & 1;
      s.coupled = flags & 2;
      std::vector<double> p(n), g(n), m(n), v(n);
      for (int64_t i = 0; i < n; ++i) {
        p[size_t(i)] = value(8);
        g[size_t(i)] = i % 7 == 0 ? 0.0 : value(40);
        m[size_t(i)] = value(20);
        v[size_t(i)] = std::fabs(value(40));
      }
      if (flags == 3) g[5] = std::nan("");
      auto p2 = p, m2 = m, v2 = v;
      double s0 = 0, s1 = 0;
      adam_step(n, p.data(), g.data(), m.data(), v.data(), s, s0, s1);
      layers_detail::adam_loop(n, p2.data(), g.data(), m2.data(), v2.data(), s,
                               s0, s1);
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = size_t(i);
        for (auto [a, b] :
             {std::pair{p[k], p2[k]}, {m[k], m2[k]}, {v[k], v2[k]}})
          EXPECT_TRUE(std::bit_cast<uint64_t>(a) ==
                          std::bit_cast<uint64_t>(b) ||
                      (std::isnan(a) && std::isnan(b)))
              << "flags " << flags << " step " << step << " i " << i;
      }
      ++cases;
    }
  EXPECT_EQ(cases, 12);
}

}  // namespace accumcheck
