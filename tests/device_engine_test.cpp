// Device<EmulatedExecutor> as an engine: gradients against a double
// reference, the backward "+=" contract, the bitwise tier, optimizer
// formulas, determinism, and a run through the one trainer loop.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/emulated.hpp"
#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle/tracked.hpp"
#include "sim/layout.hpp"
#include "sim/trainer.hpp"

namespace accumcheck {
namespace {

// A small deterministic generator (tests only).
struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(s >> 33);
  }
  // n/8 with n uniform in [-lim, lim].
  float dyadic(int lim) {
    return float(int(next() % uint32_t(2 * lim + 1)) - lim) / 8.0f;
  }
  // uniform in [-1, 1), not dyadic-small.
  float uniform() { return float(next()) / 2147483648.0f - 1.0f; }
};

Dataset make_data(const ModelSpec& m, int64_t n, bool dyadic, uint64_t seed) {
  Lcg r{seed};
  Dataset d;
  d.n = n;
  d.d_in = m.d_in();
  d.d_out = m.d_out();
  d.loss = m.loss;
  for (int64_t i = 0; i < n * d.d_in; ++i)
    d.x.push_back(dyadic ? r.dyadic(4) : r.uniform());
  if (m.loss == LossKind::mse) {
    for (int64_t i = 0; i < n * d.d_out; ++i)
      d.y.push_back(dyadic ? r.dyadic(4) : r.uniform());
  } else {
    for (int64_t i = 0; i < n; ++i)
      d.label.push_back(int32_t(r.next() % d.d_out));
  }
  return d;
}

std::vector<float> make_params(const ModelSpec& m, bool dyadic, uint64_t seed) {
  Lcg r{seed};
  std::vector<float> p(size_t(layout_of(m).total));
  for (float& v : p) v = dyadic ? r.dyadic(4) : r.uniform() * 0.5f;
  return p;
}

// Plain double forward/backward: returns sum of item losses, adds
// (1/den) * gradient into g.
double reference_fb(const ModelSpec& m, const Dataset& d,
                    const std::vector<float>& p,
                    const std::vector<int64_t>& ids, int64_t den,
                    std::vector<double>& g) {
  const ParamLayout L = layout_of(m);
  const size_t layers = L.layers();
  double total = 0;
  for (int64_t id : ids) {
    std::vector<std::vector<double>> z(layers + 1), a(layers + 1);
    a[0].assign(d.input(id), d.input(id) + d.d_in);
    for (size_t l = 1; l <= layers; ++l) {
      const TensorView& W = L.weight(l - 1);
      const TensorView& B = L.bias(l - 1);
      z[l].resize(size_t(W.rows));
      a[l].resize(size_t(W.rows));
      for (int64_t o = 0; o < W.rows; ++o) {
        double s = p[size_t(B.offset + o)];
        for (int64_t i = 0; i < W.cols; ++i)
          s += double(p[size_t(W.offset + o * W.cols + i)]) *
               a[l - 1][size_t(i)];
        z[l][size_t(o)] = s;
        double f = s;
        if (l < layers) {
          switch (m.activation) {
            case Activation::identity:
              break;
            case Activation::tanh:
              f = std::tanh(s);
              break;
            case Activation::relu:
              f = s > 0 ? s : 0;
              break;
            case Activation::gelu:
              f = s * (1 + std::erf(s / std::sqrt(2.0))) / 2;
              break;
          }
        }
        a[l][size_t(o)] = f;
      }
    }
    const auto& y = a[layers];
    std::vector<double> dz(y.size());
    const double w = 1.0 / double(den);
    if (m.loss == LossKind::mse) {
      double l = 0;
      for (size_t j = 0; j < y.size(); ++j) {
        const double diff = y[j] - d.target(id)[j];
        l += diff * diff;
        dz[j] = w * 2 * diff / double(y.size());
      }
      total += l / double(y.size());
    } else {
      double mx = y[0];
      for (double v : y) mx = std::max(mx, v);
      double s = 0;
      for (double v : y) s += std::exp(v - mx);
      const int32_t lab = d.label[size_t(id)];
      total += std::log(s) - (y[size_t(lab)] - mx);
      for (size_t j = 0; j < y.size(); ++j)
        dz[j] = w * (std::exp(y[j] - mx) / s - (int32_t(j) == lab ? 1.0 : 0.0));
    }
    for (size_t l = layers; l >= 1; --l) {
      const TensorView& W = L.weight(l - 1);
      const TensorView& B = L.bias(l - 1);
      if (l < layers) {
        for (size_t o = 0; o < dz.size(); ++o) {
          const double s = z[l][o];
          double fp = 1;
          switch (m.activation) {
            case Activation::identity:
              break;
            case Activation::tanh:
              fp = 1 - std::tanh(s) * std::tanh(s);
              break;
            case Activation::relu:
              fp = s > 0 ? 1 : 0;
              break;
            case Activation::gelu:
              fp = (1 + std::erf(s / std::sqrt(2.0))) / 2 +
                   s * std::exp(-s * s / 2) / std::sqrt(2 * M_PI);
              break;
          }
          dz[o] *= fp;
        }
      }
      std::vector<double> da(size_t(W.cols), 0.0);
      for (int64_t o = 0; o < W.rows; ++o) {
        g[size_t(B.offset + o)] += dz[size_t(o)];
        for (int64_t i = 0; i < W.cols; ++i) {
          g[size_t(W.offset + o * W.cols + i)] +=
              dz[size_t(o)] * a[l - 1][size_t(i)];
          da[size_t(i)] +=
              dz[size_t(o)] * double(p[size_t(W.offset + o * W.cols + i)]);
        }
      }
      dz = da;
    }
  }
  return total;
}

std::vector<int64_t> iota_ids(int64_t from, int64_t count) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < count; ++i) v.push_back(from + i);
  return v;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]))
      return false;
  return true;
}

struct GradientCase {
  Activation act;
  LossKind loss;
};

class DeviceGradient : public ::testing::TestWithParam<GradientCase> {};

// The device's loss, gradient and norm against the Tracked oracle's value
// and bound (the error model), and the plain double reference above (an
// independent computation: no oracle, no kernel) against the same values
// with the bound scaled to float64 (fp64_bound_scale).
TEST_P(DeviceGradient, MatchesDoubleReference) {
  using T = Tracked<OracleReal>;
  ModelSpec m{{5, 7, 6, 3}, GetParam().act, GetParam().loss};
  const Dataset d = make_data(m, 12, false, 11);
  const std::vector<float> p = make_params(m, false, 12);
  EmulatedDevice dev(m, d, p);
  Oracle<T> oracle(m, d, p);
  const std::vector<int64_t> ids = {3, 0, 7, 7, 11};
  const float loss = dev.forward_backward(ids, 10);
  const T tracked_loss = oracle.forward_backward(ids, 10);
  std::vector<double> g(p.size(), 0.0);
  const double ref_loss = reference_fb(m, d, p, ids, 10, g);
  const ParamLayout L = layout_of(m);
  const double fp64 = error_model::tolerance("fp64_bound_scale");
  const double slack = error_model::tolerance("bound_slack");
  auto judged = [](const error_model::Comparison& c) {
    EXPECT_TRUE(c.ok()) << c.summary();
  };
  judged(error_model::compare("device loss", {loss},
                              std::vector<T>{tracked_loss}));
  judged(error_model::compare("reference loss", std::vector<double>{ref_loss},
                              std::vector<T>{tracked_loss}, nullptr, slack,
                              fp64));
  const auto s = dev.state();
  judged(error_model::compare("device gradient", s.grads, oracle.grads(), &L));
  judged(error_model::compare("reference gradient", g, oracle.grads(), &L,
                              slack, fp64));
  const T tracked_norm = oracle.grad_norm();
  double norm = 0;
  for (double v : g) norm += v * v;
  judged(error_model::compare("device norm", {dev.grad_norm()},
                              std::vector<T>{tracked_norm}));
  judged(error_model::compare(
      "reference norm", std::vector<double>{std::sqrt(norm)},
      std::vector<T>{tracked_norm}, nullptr, slack, fp64));
  // loss() is forward only: the same value as forward_backward's.
  EXPECT_EQ(std::bit_cast<uint32_t>(dev.loss(ids)),
            std::bit_cast<uint32_t>(loss));
}

INSTANTIATE_TEST_SUITE_P(
    AllActivationsAndLosses, DeviceGradient,
    ::testing::Values(GradientCase{Activation::identity, LossKind::mse},
                      GradientCase{Activation::tanh, LossKind::mse},
                      GradientCase{Activation::relu, LossKind::cross_entropy},
                      GradientCase{Activation::gelu, LossKind::cross_entropy},
                      GradientCase{Activation::tanh, LossKind::cross_entropy}));

// loss.backward() twice on one micro-batch: exactly twice the gradient.
TEST(DeviceEngine, BackwardTwiceIsExactlyTwice) {
  for (bool dyadic : {true, false}) {
    ModelSpec m{{4, 8, 3},
                dyadic ? Activation::relu : Activation::tanh,
                dyadic ? LossKind::mse : LossKind::cross_entropy};
    const Dataset d = make_data(m, 8, dyadic, 3);
    EmulatedDevice dev(m, d, make_params(m, dyadic, 4));
    const std::vector<int64_t> ids = {1, 2, 5, 6};
    const float l1 = dev.forward_backward(ids, 4);
    const std::vector<float> once = dev.state().grads;
    const float l2 = dev.forward_backward(ids, 4);
    const std::vector<float> twice = dev.state().grads;
    EXPECT_EQ(l1, l2);
    for (size_t i = 0; i < once.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(twice[i]),
                std::bit_cast<uint32_t>(2.0f * once[i]))
          << "dyadic=" << dyadic << " index " << i;
  }
}

// The bitwise tier: dyadic data, MSE, identity/ReLU, b and K powers of
// two: K micro-batches each weighted 1/(K b) sum to the large batch's
// gradient weighted 1/(K b), bit for bit (every sum is exact).
TEST(DeviceEngine, BitwiseTierAccumulationEqualsLargeBatch) {
  for (Activation act : {Activation::identity, Activation::relu}) {
    for (int64_t K : {1, 2, 4, 8}) {
      const int64_t b = 16 / K;
      ModelSpec m{{4, 8, 4}, act, LossKind::mse};
      const Dataset d = make_data(m, 16, true, 21);
      const std::vector<float> p = make_params(m, true, 22);
      EmulatedDevice micro(m, d, p), large(m, d, p);
      float micro_loss = 0;
      for (int64_t k = 0; k < K; ++k)
        micro_loss += micro.forward_backward(iota_ids(k * b, b), K * b);
      const float large_loss = large.forward_backward(iota_ids(0, 16), K * b);
      EXPECT_EQ(micro_loss, large_loss);
      EXPECT_TRUE(bits_equal(micro.state().grads, large.state().grads))
          << "K=" << K << " act=" << int(act);
      // And both equal the exact (double) gradient.
      std::vector<double> g(p.size(), 0.0);
      reference_fb(m, d, p, iota_ids(0, 16), K * b, g);
      const auto s = large.state();
      for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(double(s.grads[i]), g[i]);
    }
  }
}

EngineState<float> hand_state(int64_t P, uint64_t seed) {
  Lcg r{seed};
  EngineState<float> s;
  for (int64_t i = 0; i < P; ++i) {
    s.params.push_back(r.uniform());
    s.grads.push_back(r.uniform() * 0.1f);
  }
  return s;
}

TEST(DeviceEngine, SgdMomentumWeightDecayMatchesFormulas) {
  ModelSpec m{{3, 2}, Activation::identity, LossKind::mse};
  const Dataset d = make_data(m, 2, false, 1);
  EmulatedDevice dev(m, d, make_params(m, false, 2));
  const int64_t P = layout_of(m).total;
  EngineState<float> s = hand_state(P, 5);
  dev.set_state(s);
  OptimizerSpec opt;
  opt.kind = OptimizerKind::sgd;
  opt.momentum = 0.9;
  opt.weight_decay = 0.01;
  std::vector<float> p = s.params;
  std::vector<float> buf(static_cast<size_t>(P));
  const std::vector<float>& g = s.grads;
  for (int step = 0; step < 3; ++step) {
    const double lr = 0.1 / (step + 1);
    dev.optimizer_step(opt, lr);
    for (int64_t i = 0; i < P; ++i) {
      const float dp = g[size_t(i)] + float(opt.weight_decay) * p[size_t(i)];
      buf[size_t(i)] =
          step == 0 ? dp : buf[size_t(i)] * float(opt.momentum) + dp;
      p[size_t(i)] = p[size_t(i)] + float(-lr) * buf[size_t(i)];
    }
    const auto st = dev.state();
    EXPECT_TRUE(bits_equal(st.params, p)) << "step " << step;
    EXPECT_TRUE(bits_equal(st.exp_avg, buf)) << "step " << step;
    EXPECT_TRUE(st.exp_avg_sq.empty());
    EXPECT_EQ(st.optimizer_steps, step + 1);
  }
}

TEST(DeviceEngine, PlainSgdKeepsNoState) {
  ModelSpec m{{3, 2}, Activation::identity, LossKind::mse};
  EmulatedDevice dev(m, make_data(m, 2, false, 1), make_params(m, false, 2));
  const int64_t P = layout_of(m).total;
  EngineState<float> s = hand_state(P, 6);
  dev.set_state(s);
  OptimizerSpec opt;
  dev.optimizer_step(opt, 0.5);
  const auto st = dev.state();
  EXPECT_TRUE(st.exp_avg.empty());
  for (int64_t i = 0; i < P; ++i)
    EXPECT_EQ(st.params[size_t(i)],
              s.params[size_t(i)] + float(-0.5) * s.grads[size_t(i)]);
}

void adam_reference(OptimizerKind kind, double wd) {
  ModelSpec m{{4, 3}, Activation::identity, LossKind::mse};
  using T = Tracked<OracleReal>;
  const Dataset data = make_data(m, 2, false, 1);
  const std::vector<float> init = make_params(m, false, 2);
  EmulatedDevice dev(m, data, init);
  Oracle<T> oracle(m, data, init);
  const int64_t P = layout_of(m).total;
  EngineState<float> s = hand_state(P, 7);
  dev.set_state(s);
  oracle.set_state(lift_state<T>(s));
  OptimizerSpec opt;
  opt.kind = kind;
  opt.beta1 = 0.9;
  opt.beta2 = 0.999;
  opt.eps = 1e-8;
  opt.weight_decay = wd;
  std::vector<float> p = s.params, mm(size_t(P), 0.0f), vv(size_t(P), 0.0f);
  std::vector<double> pd(p.begin(), p.end()), md(size_t(P), 0),
      vd(size_t(P), 0);
  for (int t = 1; t <= 4; ++t) {
    const double lr = 1e-2 * t;
    dev.optimizer_step(opt, lr);
    const double bc1 = 1 - std::pow(opt.beta1, t),
                 bc2 = 1 - std::pow(opt.beta2, t);
    for (int64_t i = 0; i < P; ++i) {
      const size_t j = size_t(i);
      // float, PyTorch 1.13 operation order
      float pi = p[j];
      if (kind == OptimizerKind::adamw) pi = pi * float(1 - lr * wd);
      float gi = s.grads[j];
      if (kind == OptimizerKind::adam && wd != 0) gi = gi + float(wd) * pi;
      mm[j] = mm[j] * float(opt.beta1) + float(1 - opt.beta1) * gi;
      vv[j] = vv[j] * float(opt.beta2) + (float(1 - opt.beta2) * gi) * gi;
      const float denom =
          std::sqrt(vv[j]) / float(std::sqrt(bc2)) + float(opt.eps);
      p[j] = pi + float(-(lr / bc1)) * (mm[j] / denom);
      // double, the textbook formula
      double pdi = pd[j];
      if (kind == OptimizerKind::adamw) pdi *= 1 - lr * wd;
      double gd = s.grads[j];
      if (kind == OptimizerKind::adam) gd += wd * pdi;
      md[j] = opt.beta1 * md[j] + (1 - opt.beta1) * gd;
      vd[j] = opt.beta2 * vd[j] + (1 - opt.beta2) * gd * gd;
      pd[j] = pdi - (lr / bc1) * md[j] /
                        (std::sqrt(vd[j]) / std::sqrt(bc2) + opt.eps);
    }
    const auto st = dev.state();
    EXPECT_TRUE(bits_equal(st.params, p)) << "t=" << t;
    EXPECT_TRUE(bits_equal(st.exp_avg, mm)) << "t=" << t;
    EXPECT_TRUE(bits_equal(st.exp_avg_sq, vv)) << "t=" << t;
    // The textbook formula in double and the device's float32 step, each
    // against the Tracked oracle's step and its bound (the double one
    // scaled to float64).
    oracle.optimizer_step(opt, lr);
    const std::vector<T> tracked = oracle.state().params;
    const error_model::Comparison cf =
        error_model::compare("device step", st.params, tracked);
    EXPECT_TRUE(cf.ok()) << "t=" << t << ": " << cf.summary();
    const error_model::Comparison cd =
        error_model::compare("textbook step", pd, tracked, nullptr,
                             error_model::tolerance("bound_slack"),
                             error_model::tolerance("fp64_bound_scale"));
    EXPECT_TRUE(cd.ok()) << "t=" << t << ": " << cd.summary();
  }
}

TEST(DeviceEngine, AdamMatchesFormulas) {
  adam_reference(OptimizerKind::adam, 0.0);
}
TEST(DeviceEngine, AdamCoupledDecayMatchesFormulas) {
  adam_reference(OptimizerKind::adam, 0.05);
}
TEST(DeviceEngine, AdamWMatchesFormulas) {
  adam_reference(OptimizerKind::adamw, 0.05);
}

TEST(DeviceEngine, L2ScaleZeroAndNorm) {
  ModelSpec m{{3, 2}, Activation::identity, LossKind::mse};
  EmulatedDevice dev(m, make_data(m, 2, false, 1), make_params(m, false, 2));
  const int64_t P = layout_of(m).total;
  EngineState<float> s = hand_state(P, 8);
  dev.set_state(s);
  dev.add_l2(0.3, 4);
  dev.scale_grads(0.5f);
  auto st = dev.state();
  float sq = 0;
  for (int64_t i = 0; i < P; ++i) {
    const size_t j = size_t(i);
    const float want = (s.grads[j] + float(0.3 / 4) * s.params[j]) * 0.5f;
    EXPECT_EQ(st.grads[j], want);
    sq = sq + want * want;
  }
  EXPECT_EQ(dev.grad_norm(), std::sqrt(sq));
  dev.zero_grad();
  st = dev.state();
  for (float g : st.grads) EXPECT_EQ(std::bit_cast<uint32_t>(g), 0u);
}

TEST(DeviceEngine, RejectsBadInput) {
  ModelSpec m{{3, 4, 2}, Activation::tanh, LossKind::cross_entropy};
  const Dataset d = make_data(m, 4, false, 1);
  EXPECT_THROW(EmulatedDevice(m, d, std::vector<float>(3)),
               std::invalid_argument);
  EmulatedDevice dev(m, d, make_params(m, false, 2));
  EXPECT_THROW(dev.forward_backward({4}, 1), std::out_of_range);
  EXPECT_THROW(dev.forward_backward({0}, 0), std::invalid_argument);
  EngineState<float> bad;
  bad.params.resize(5);
  EXPECT_THROW(dev.set_state(bad), std::invalid_argument);
  EXPECT_EQ(dev.forward_backward({}, 1), 0.0f);
}

// Two identical runs give identical bits (and a third, from a restored
// state, continues identically: teacher forcing).
TEST(DeviceEngine, DeterministicAndRestartable) {
  ModelSpec m{{6, 16, 16, 4}, Activation::gelu, LossKind::cross_entropy};
  const Dataset d = make_data(m, 40, false, 31);
  const std::vector<float> p = make_params(m, false, 32);
  OptimizerSpec opt;
  opt.kind = OptimizerKind::adamw;
  opt.weight_decay = 0.01;
  auto run = [&](EmulatedDevice& dev, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (int k = 0; k < 3; ++k)
        dev.forward_backward(iota_ids((step * 9 + k * 3) % 37, 3), 9);
      const float norm = dev.grad_norm();
      if (norm > 1.0f) dev.scale_grads(1.0f / (norm + 1e-6f));
      dev.optimizer_step(opt, 1e-3);
      dev.zero_grad();
    }
  };
  EmulatedDevice a(m, d, p), b(m, d, p), c(m, d, p);
  run(a, 0, 6);
  run(b, 0, 3);
  c.set_state(b.state());
  run(b, 3, 6);
  run(c, 3, 6);
  const auto sa = a.state(), sb = b.state(), sc = c.state();
  EXPECT_TRUE(bits_equal(sa.params, sb.params));
  EXPECT_TRUE(bits_equal(sa.exp_avg, sb.exp_avg));
  EXPECT_TRUE(bits_equal(sa.exp_avg_sq, sb.exp_avg_sq));
  EXPECT_TRUE(bits_equal(sa.params, sc.params));
  EXPECT_TRUE(bits_equal(sa.exp_avg_sq, sc.exp_avg_sq));
  EXPECT_EQ(sa.optimizer_steps, 6);
  EXPECT_EQ(sc.optimizer_steps, 6);
  EXPECT_FALSE(bits_equal(sa.params, p));
}

// The device through Trainer<Engine>: correct accumulation over K = 4
// equals the K = 1 large batch bit for bit on the bitwise tier.
TEST(DeviceEngine, TrainerCorrectAccumulationIsTheLargeBatchBitwise) {
  Scenario s;
  s.model = ModelSpec{{4, 8, 2}, Activation::relu, LossKind::mse};
  s.optimizer.kind = OptimizerKind::sgd;
  s.optimizer.lr = 0.25;
  const Dataset d = make_data(s.model, 32, true, 41);
  const std::vector<float> p = make_params(s.model, true, 42);
  auto plan_of = [](int64_t K, int64_t b) {
    Plan plan;
    plan.accumulation = K;
    EpochPlan ep;
    ep.accumulation = K;
    for (int64_t w = 0; w < 2; ++w) {  // two windows of 16 samples
      Window win;
      for (int64_t k = 0; k < K; ++k) {
        MicroBatch mb;
        mb.shards.push_back(iota_ids(w * 16 + k * b, b));
        win.micro.push_back(mb);
      }
      ep.windows.push_back(win);
    }
    plan.epochs.push_back(ep);
    return plan;
  };
  EmulatedDevice micro(s.model, d, p), large(s.model, d, p);
  s.batching.accumulation = 4;
  Trainer<EmulatedDevice> tm(micro, s, Behavior{}, s.optimizer.lr);
  const accumcheck::Run<float> rm = tm.run(plan_of(4, 4), "correct");
  s.batching.accumulation = 1;
  Trainer<EmulatedDevice> tl(large, s, Behavior{}, s.optimizer.lr);
  const accumcheck::Run<float> rl = tl.run(plan_of(1, 16), "reference");
  ASSERT_EQ(rm.steps.size(), 2u);
  ASSERT_EQ(rl.steps.size(), 2u);
  // Step 0 is on the bitwise tier (its gradient is exact, both runs round
  // lr * g identically).  Step 1 starts from parameters that are no longer
  // coarse dyadics, so its sums round, in different orders.
  EXPECT_TRUE(bits_equal(rm.steps[0].grad, rl.steps[0].grad));
  EXPECT_TRUE(bits_equal(rm.steps[0].param, rl.steps[0].param));
  // Step 1 is judged against the error model's bound by the property
  // equivalence.device; here only that both runs took it.
  EXPECT_EQ(rm.steps[1].param.size(), rl.steps[1].param.size());
  EXPECT_EQ(rm.windows.size(), 2u);
}

}  // namespace
}  // namespace accumcheck
