// Low-precision gradient buffers (issue 13, part 1):
//  - the kernels' round_to (gpu/kernels.hpp) equals the oracle's exact
//    round-to-nearest-even (round_to_buffer) on a sweep of float32 bits,
//    and the textbook cases (in bf16 256 + 1 = 256; fp16 overflow and
//    subnormals);
//  - the device engine's bf16/fp16 accumulation against the error model's
//    K-term bound, K = 1, 2, 4, ..., 256, printed as the table
//    docs/mixed-precision-and-state.md quotes;
//  - the CUDA executor computes the emulated executor's bits with bf16 and
//    fp16 buffers (skipped without a GPU).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ios>
#include <limits>
#include <vector>

#include "gpu/emulated.hpp"
#include "gpu/kernels.hpp"
#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle/tracked.hpp"
#include "properties/harness.hpp"
#include "sim/data.hpp"
#include "sim/layout.hpp"

#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "gpu/cuda/cuda_executor.hpp"
#include "tests/cuda_property.hpp"
#endif

namespace accumcheck {
namespace {

kern::Fmt fmt_of(GradBuffer b) { return kern::Fmt(int32_t(b)); }

TEST(PrecisionRounding, TextbookCases) {
  const auto bf = [](float x) { return kern::round_to(kern::Fmt::bf16, x); };
  const auto hf = [](float x) { return kern::round_to(kern::Fmt::fp16, x); };
  EXPECT_EQ(bf(256.0f + 1.0f), 256.0f) << "in bf16 256 + 1 = 256 (tie, even)";
  EXPECT_EQ(bf(259.0f), 260.0f) << "tie between 258 and 260: even";
  EXPECT_EQ(bf(257.5f), 258.0f) << "above the tie";
  EXPECT_EQ(bf(-257.0f), -256.0f);
  EXPECT_EQ(hf(2049.0f), 2048.0f) << "in fp16 2048 + 1 = 2048";
  EXPECT_EQ(hf(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(hf(65520.0f))) << "fp16 overflow";
  EXPECT_EQ(hf(std::ldexp(1.0f, -25)), 0.0f) << "half the quantum: to 0";
  EXPECT_EQ(hf(std::ldexp(3.0f, -26)), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(hf(std::nanf(""))));
  EXPECT_TRUE(std::isinf(bf(std::ldexp(1.9999999f, 127))));
}

// Every 997th float32 bit pattern (both signs), both formats: the kernel's
// bit trick / magic-number rounding equals the exact rounding.
TEST(PrecisionRounding, KernelEqualsExactRoundingOnASweep) {
  for (GradBuffer b : {GradBuffer::bf16, GradBuffer::fp16}) {
    int64_t diff = 0, n = 0;
    for (uint32_t bits = 0; bits < 0x7f800000u; bits += 997)
      for (float x :
           {std::bit_cast<float>(bits), -std::bit_cast<float>(bits)}) {
        const float k = kern::round_to(fmt_of(b), x);
        const double want = oracle_detail::round_to_buffer_exact(double(x), b);
        ++n;
        if (!(double(k) == want)) {
          if (diff < 5)
            ADD_FAILURE() << "x=" << x << " kernel " << k << " exact " << want;
          ++diff;
        }
      }
    EXPECT_EQ(diff, 0) << n << " values";
  }
}

// round_to_buffer's double path (magic-number rounding) against the
// definition, bit for bit (the sign of zero too), on doubles float32 does
// not have: random significands at every exponent from below fp16's and
// bf16's subnormals to beyond their overflow and near double's own limits,
// exact ties and the values beside them, both signs.
TEST(PrecisionRounding, DoublePathEqualsTheDefinition) {
  uint64_t state = 0x9e3779b97f4a7c15u;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  };
  std::vector<double> xs;
  for (int e = -1074; e <= 1023; ++e)
    for (int k = 0; k < 24; ++k) {
      const double m = 1 + double(next() >> 12) * 0x1p-52;  // [1, 2)
      xs.push_back(std::ldexp(m, e));
    }
  for (int e = -160; e <= 140; ++e)  // ties at every quantum, and beside
    for (int p : {8, 11})
      for (int k = 0; k < 8; ++k) {
        const double tie = std::ldexp(double(next() % 512) + 0.5, e - p);
        xs.insert(xs.end(),
                  {tie, std::nextafter(tie, 0.0), std::nextafter(tie, 1e300)});
      }
  xs.insert(xs.end(), {0.0, 65504.0, 65519.999, 65520.0, 0x1.fep127, 0x1.ffp127,
                       std::numeric_limits<double>::max(),
                       std::numeric_limits<double>::denorm_min(),
                       std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()});
  int64_t diff = 0, n = 0;
  for (GradBuffer b : {GradBuffer::bf16, GradBuffer::fp16, GradBuffer::fp32})
    for (double a : xs)
      for (double x : {a, -a}) {
        const double got = round_to_buffer(x, b);
        const double want = oracle_detail::round_to_buffer_exact(x, b);
        ++n;
        if (std::bit_cast<uint64_t>(got) != std::bit_cast<uint64_t>(want) &&
            !(std::isnan(got) && std::isnan(want))) {
          if (diff < 5)
            ADD_FAILURE() << std::hexfloat << "x=" << x << " got " << got
                          << " want " << want;
          ++diff;
        }
      }
  EXPECT_EQ(diff, 0) << n << " values";
}

// ------------------------------------------- error against bound, K = 1..256

// A fixed MLP on generated data, micro-batches of one sample, so the K
// terms of a window differ.
struct Fixture {
  Scenario s;
  Dataset d;
  std::vector<float> p;
  Fixture() {
    s.model.widths = {6, 8, 3};
    s.model.activation = Activation::tanh;
    s.model.loss = LossKind::mse;
    s.data.samples = 256;
    s.data.seed = 13;
    s.batching.micro_batch = 1;
    d = make_dataset(s);
    p = initial_parameters(s, layout_of(s.model));
  }
};

struct Row {
  double max_ratio = 0;  // max over elements of err / bound
  double max_err_u = 0;  // max err / sum|t|, in units of the format's u
};

Row measure(const Fixture& st, GradBuffer b, int64_t K) {
  using T = Tracked<OracleReal>;
  EmulatedDevice dev(st.s.model, st.d, st.p);
  dev.set_grad_buffer(b);
  const size_t P = st.p.size();
  std::vector<OracleReal> sum(P, OracleReal(0)), abs_sum = sum, e_sum = sum;
  for (int64_t k = 0; k < K; ++k) {
    dev.forward_backward({k}, LossWeight{1, K});
    Oracle<T> o(st.s.model, st.d, st.p);
    o.forward_backward({k}, LossWeight{1, K});
    for (size_t i = 0; i < P; ++i) {
      using std::abs;
      sum[i] += o.grads()[i].v;
      abs_sum[i] += abs(o.grads()[i].v);
      e_sum[i] += o.grads()[i].e;
    }
  }
  const std::vector<float> g = dev.state().grads;
  Row r;
  for (size_t i = 0; i < P; ++i) {
    const double err =
        std::fabs(static_cast<double>(OracleReal(g[i]) - sum[i]));
    const double bound = error_model::lowp_sum_bound(
        b, K, static_cast<double>(abs_sum[i]), static_cast<double>(e_sum[i]));
    EXPECT_LE(err, bound) << "K=" << K << " element " << i;
    r.max_ratio = std::max(r.max_ratio, err / bound);
    const double a = static_cast<double>(abs_sum[i]);
    if (a > 0)
      r.max_err_u =
          std::max(r.max_err_u, err / (a * error_model::buffer_unit(b)));
  }
  return r;
}

TEST(PrecisionBuffer, ErrorAgainstBoundAsKGrows) {
  const Fixture st;
  std::printf(
      "   K | bf16 err/bound  bf16 err/(u sum|t|) | fp16 err/bound  "
      "fp16 err/(u sum|t|)\n");
  double worst = 0;
  for (int64_t K = 1; K <= 256; K *= 2) {
    const Row bf = measure(st, GradBuffer::bf16, K);
    const Row hf = measure(st, GradBuffer::fp16, K);
    std::printf("%4lld | %14.4f  %19.3f | %14.4f  %19.3f\n", (long long)K,
                bf.max_ratio, bf.max_err_u, hf.max_ratio, hf.max_err_u);
    worst = std::max({worst, bf.max_ratio, hf.max_ratio});
  }
  // The bound is not vacuous: somewhere the error uses a visible share.
  EXPECT_GT(worst, error_model::tolerance("bound_min_use"));
}

// A low-precision buffer changes the sum where float32 would not: the
// bf16 window sum differs from the fp32 one (and both stay in bounds).
TEST(PrecisionBuffer, Bf16DiffersFromFp32) {
  const Fixture st;
  EmulatedDevice a(st.s.model, st.d, st.p), b(st.s.model, st.d, st.p);
  b.set_grad_buffer(GradBuffer::bf16);
  for (int64_t k = 0; k < 64; ++k) {
    a.forward_backward({k}, LossWeight{1, 64});
    b.forward_backward({k}, LossWeight{1, 64});
  }
  EXPECT_NE(a.state().grads, b.state().grads);
  EXPECT_TRUE(b.grads_finite());
  b.scale_grads(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(b.grads_finite()) << "found_inf after an overflow";
}

#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
// The buffer kernels (AccumulateGradRounded, ScaleGrads with a format,
// CountNonFinite) on the GPU: the emulated executor's bits (the matrix
// products are kernel bodies too, so any data would do; these are dyadic).
TEST(PrecisionCuda, BufferKernelsMatchEmulated) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  Scenario s;
  s.model.widths = {4, 8, 4};
  s.model.activation = Activation::relu;
  s.data.samples = 64;
  s.data.dyadic = true;
  s.data.seed = 5;
  const Dataset d = make_dataset(s);
  const std::vector<float> p = initial_parameters(s, layout_of(s.model));
  for (GradBuffer b : {GradBuffer::bf16, GradBuffer::fp16}) {
    EmulatedDevice cpu(s.model, d, p);
    CudaDevice gpu(s.model, d, p);
    cpu.set_grad_buffer(b);
    gpu.set_grad_buffer(b);
    for (int64_t k = 0; k < 32; ++k) {
      cpu.forward_backward({2 * k, 2 * k + 1}, LossWeight{1 << 16, 64});
      gpu.forward_backward({2 * k, 2 * k + 1}, LossWeight{1 << 16, 64});
    }
    cpu.add_l2(0.01, 3);
    gpu.add_l2(0.01, 3);
    cpu.scale_grads(0.3f);
    gpu.scale_grads(0.3f);
    const auto gc = cpu.state().grads, gg = gpu.state().grads;
    ASSERT_EQ(gc.size(), gg.size());
    for (size_t i = 0; i < gc.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(gc[i]), std::bit_cast<uint32_t>(gg[i]))
          << i;
    EXPECT_EQ(cpu.grads_finite(), gpu.grads_finite());
    // 1e30 twice: bf16 has float32's range, so one 1e30 can stay finite
    // (seen on an H100: every gradient times 1e30 was finite in bf16).
    for (int twice = 0; twice < 2; ++twice) {
      cpu.scale_grads(1e30f);
      gpu.scale_grads(1e30f);
    }
    EXPECT_FALSE(gpu.grads_finite());
    EXPECT_EQ(cpu.grads_finite(), gpu.grads_finite());
  }
}
ACCUMCHECK_CUDA_PROP(PrecisionCuda, BufferBound, "precision.buffer-bound.cuda")
#endif

}  // namespace
}  // namespace accumcheck
