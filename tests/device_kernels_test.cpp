// Launch coverage of every kernel body (gpu/kernels.hpp), test-backend-ops
// style: each buffer sits between guard regions of NaN-boxed canaries;
// the emulated launch over the kernel's documented grid runs thread by
// thread and every output element must be written by exactly one thread,
// no guard may change, and no output may read a guard (inputs' guards
// are NaN, so an out-of-bounds read shows up as a NaN output).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/emulated.hpp"
#include "gpu/kernels.hpp"
#include "sim/errors.hpp"
#include "sim/layout.hpp"

namespace accumcheck {
namespace {

constexpr int64_t kGuard = 16;
constexpr uint32_t kGuardBits = 0x7fc0dead;  // a quiet NaN with a payload
constexpr uint32_t kUnsetBits = 0x7fc0beef;  // "not written yet"

template <class T>
struct Guarded {
  std::vector<T> store;
  int64_t n;
  explicit Guarded(int64_t n_, bool unset = false) : n(n_) {
    store.resize(size_t(n + 2 * kGuard));
    for (auto& v : store) v = from_bits(kGuardBits);
    if (unset)
      for (int64_t i = 0; i < n; ++i) data()[i] = from_bits(kUnsetBits);
  }
  static T from_bits(uint32_t b) {
    if constexpr (sizeof(T) == 4) {
      T v;
      std::memcpy(&v, &b, 4);
      return v;
    } else {
      return T(int64_t(1) << 40);  // an out-of-range id
    }
  }
  T* data() { return store.data() + kGuard; }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b(store.size() * sizeof(T));
    std::memcpy(b.data(), store.data(), b.size());
    return b;
  }
};

struct Out {
  std::string name;
  std::vector<uint8_t> (*snap)(const void*);
  const void* buf;
  int64_t n, elem;
};

template <class T>
Out out(const char* name, const Guarded<T>& g) {
  return {
      name,
      [](const void* p) { return static_cast<const Guarded<T>*>(p)->bytes(); },
      &g, g.n, int64_t(sizeof(T))};
}

// Runs body(i) for i in [0, n) one at a time and checks the write pattern.
template <class Body>
void check_coverage(const char* kernel, int64_t n, const Body& body,
                    std::vector<Out> outs) {
  std::vector<std::vector<int>> writes(outs.size());
  for (size_t o = 0; o < outs.size(); ++o)
    writes[o].assign(size_t(outs[o].n), 0);
  EmulatedExecutor ex;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::vector<uint8_t>> before;
    for (auto& o : outs) before.push_back(o.snap(o.buf));
    ex.launch(1, [&](int64_t) { body(i); });
    for (size_t o = 0; o < outs.size(); ++o) {
      const auto after = outs[o].snap(outs[o].buf);
      const int64_t e = outs[o].elem;
      for (int64_t k = 0; k < int64_t(after.size()) / e; ++k) {
        if (std::memcmp(&after[size_t(k * e)], &before[o][size_t(k * e)],
                        size_t(e)) == 0)
          continue;
        const int64_t idx = k - kGuard;
        ASSERT_TRUE(idx >= 0 && idx < outs[o].n)
            << kernel << ": thread " << i << " wrote guard of " << outs[o].name
            << " at " << idx;
        ++writes[o][size_t(idx)];
      }
    }
  }
  for (size_t o = 0; o < outs.size(); ++o)
    for (int64_t k = 0; k < outs[o].n; ++k)
      EXPECT_EQ(writes[o][size_t(k)], 1)
          << kernel << ": " << outs[o].name << "[" << k << "]";
}

template <class T>
void expect_finite(const char* kernel, Guarded<T>& g) {
  for (int64_t i = 0; i < g.n; ++i)
    EXPECT_FALSE(std::isnan(double(g.data()[i])))
        << kernel << ": NaN output at " << i << " (read a guard?)";
}

struct Rng {
  uint32_t s = 12345;
  float next() {  // in [-1, 1), never 0
    s = s * 1664525u + 1013904223u;
    const float v = float(s >> 8) / 8388608.0f - 1.0f;
    return v == 0.0f ? 0.25f : v;
  }
};

Guarded<float> filled(int64_t n, Rng& r, float scale = 1.0f) {
  Guarded<float> g(n);
  for (int64_t i = 0; i < n; ++i) g.data()[i] = r.next() * scale;
  return g;
}

constexpr int64_t R = 5, C = 7;  // rows, cols

TEST(KernelCoverage, GatherRows) {
  Rng r;
  auto src = filled(9 * C, r);
  Guarded<int64_t> ids(R);
  const int64_t pick[R] = {8, 0, 3, 3, 5};
  for (int64_t i = 0; i < R; ++i) ids.data()[i] = pick[i];
  Guarded<float> dst(R * C, true);
  check_coverage("GatherRows", R * C,
                 kern::GatherRows<float>{src.data(), ids.data(), dst.data(), C},
                 {out("dst", dst)});
  expect_finite("GatherRows", dst);
  Guarded<int32_t> lsrc(9), ldst(R);
  for (int32_t i = 0; i < 9; ++i) lsrc.data()[i] = i + 1;
  for (int64_t i = 0; i < R; ++i) ldst.data()[i] = -1;
  check_coverage(
      "GatherRows<int32>", R,
      kern::GatherRows<int32_t>{lsrc.data(), ids.data(), ldst.data(), 1},
      {out("dst", ldst)});
  for (int64_t i = 0; i < R; ++i) EXPECT_EQ(ldst.data()[i], pick[i] + 1);
}

TEST(KernelCoverage, BiasActivationForwardAndBackward) {
  for (int act = 0; act < 4; ++act) {
    Rng r;
    auto z = filled(R * C, r, 2.0f);
    auto bias = filled(C, r);
    Guarded<float> a(R * C, true);
    check_coverage("BiasActivationForward", R * C,
                   kern::BiasActivationForward{z.data(), bias.data(), a.data(),
                                               C, kern::Act(act)},
                   {out("z", z), out("a", a)});
    expect_finite("BiasActivationForward", a);
    auto da = filled(R * C, r);
    Guarded<float> dz(R * C, true);
    check_coverage("ActivationBackward", R * C,
                   kern::ActivationBackward{da.data(), z.data(), a.data(),
                                            dz.data(), kern::Act(act)},
                   {out("dz", dz)});
    expect_finite("ActivationBackward", dz);
  }
}

TEST(KernelCoverage, BiasGradColSumAndAccumulate) {
  Rng r;
  auto dz = filled(R * C, r);
  auto db = filled(C, r);
  check_coverage("BiasGradColSum", C,
                 kern::BiasGradColSum{dz.data(), db.data(), R, C},
                 {out("dbias", db)});
  expect_finite("BiasGradColSum", db);
  auto dst = filled(R * C, r);
  auto src = filled(R * C, r);
  check_coverage("AccumulateGrad", R * C,
                 kern::AccumulateGrad{dst.data(), src.data()},
                 {out("dst", dst)});
  expect_finite("AccumulateGrad", dst);
  Guarded<float> f(R * C, true);
  check_coverage("Fill", R * C, kern::Fill{f.data(), 0.0f}, {out("dst", f)});
}

TEST(KernelCoverage, MseLoss) {
  Rng r;
  auto y = filled(R * C, r), t = filled(R * C, r);
  Guarded<float> loss(R, true), dy(R * C, true);
  check_coverage("MseLossForward", R,
                 kern::MseLossForward{y.data(), t.data(), loss.data(), C},
                 {out("loss", loss)});
  expect_finite("MseLossForward", loss);
  check_coverage("MseLossBackward", R * C,
                 kern::MseLossBackward{y.data(), t.data(), dy.data(), C, 0.5f},
                 {out("dy", dy)});
  expect_finite("MseLossBackward", dy);
}

TEST(KernelCoverage, CrossEntropy) {
  Rng r;
  auto y = filled(R * C, r, 3.0f);
  Guarded<int32_t> label(R);
  for (int64_t i = 0; i < R; ++i) label.data()[i] = int32_t((i * 3) % C);
  Guarded<float> loss(R, true), mx(R, true), sum(R, true), dy(R * C, true);
  check_coverage("CrossEntropyForward", R,
                 kern::CrossEntropyForward{y.data(), label.data(), loss.data(),
                                           mx.data(), sum.data(), C},
                 {out("loss", loss), out("row_max", mx), out("row_sum", sum)});
  expect_finite("CrossEntropyForward", loss);
  check_coverage("CrossEntropyBackward", R * C,
                 kern::CrossEntropyBackward{y.data(), label.data(), mx.data(),
                                            sum.data(), dy.data(), C, 0.25f},
                 {out("dy", dy)});
  expect_finite("CrossEntropyBackward", dy);
  // Rows of softmax - onehot sum to ~0.
  for (int64_t i = 0; i < R; ++i) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += dy.data()[i * C + c];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST(KernelCoverage, Reductions) {
  Rng r;
  auto v = filled(R * C, r);
  Guarded<float> s(1, true), nrm(1, true);
  check_coverage("SumSerial", 1, kern::SumSerial{v.data(), R * C, s.data()},
                 {out("out", s)});
  check_coverage("GradNorm", 1, kern::GradNorm{v.data(), R * C, nrm.data()},
                 {out("out", nrm)});
  expect_finite("SumSerial", s);
  expect_finite("GradNorm", nrm);
}

TEST(KernelCoverage, ElementwiseUpdates) {
  const int64_t N = R * C;
  Rng r;
  auto g = filled(N, r), p = filled(N, r);
  check_coverage("ScaleGrads", N, kern::ScaleGrads{g.data(), 0.5f},
                 {out("g", g)});
  check_coverage("AddL2", N, kern::AddL2{g.data(), p.data(), 0.125f},
                 {out("g", g)});
  for (bool first : {true, false}) {
    Guarded<float> buf(N, first);
    if (!first)
      for (int64_t i = 0; i < N; ++i) buf.data()[i] = r.next();
    kern::SgdStep k{p.data(), g.data(), buf.data(), -0.1f, 0.9f,
                    0.01f,    true,     true,       first};
    check_coverage("SgdStep", N, k, {out("p", p), out("buf", buf)});
    expect_finite("SgdStep", p);
    expect_finite("SgdStep", buf);
  }
  auto m = filled(N, r), v = filled(N, r);
  for (int64_t i = 0; i < N; ++i) v.data()[i] = std::fabs(v.data()[i]);
  for (bool adamw : {false, true}) {
    kern::AdamStep k{p.data(), g.data(), m.data(), v.data(), 0.9f,
                     0.1f,     0.999f,   0.001f,   -0.01f,   0.5f,
                     1e-8f,    0.01f,    0.999f,   !adamw,   adamw};
    check_coverage("AdamStep", N, k, {out("p", p), out("m", m), out("v", v)});
    expect_finite("AdamStep", p);
  }
}

}  // namespace
}  // namespace accumcheck

namespace accumcheck {
namespace {

TEST(KernelCoverage, ActivationForwardAndDropout) {
  Rng r;
  auto in = filled(R * C, r, 2.0f);
  for (int act = 0; act < 4; ++act) {
    Guarded<float> o(R * C, true);
    check_coverage("ActivationForward", R * C,
                   kern::ActivationForward{in.data(), o.data(), kern::Act(act)},
                   {out("out", o)});
    expect_finite("ActivationForward", o);
  }
  Guarded<int32_t> keep(R * C);
  for (int64_t i = 0; i < R * C; ++i) keep.data()[i] = int32_t(i % 3 != 0);
  Guarded<float> o(R * C, true);
  check_coverage("Dropout", R * C,
                 kern::Dropout{in.data(), keep.data(), o.data(), 2.0f},
                 {out("out", o)});
  for (int64_t i = 0; i < R * C; ++i)
    EXPECT_EQ(o.data()[i], keep.data()[i] ? in.data()[i] * 2.0f : 0.0f);
}

TEST(KernelCoverage, Norms) {
  // BatchNorm (0 row groups), LayerNorm (1), GroupNorm (2 groups of 4).
  constexpr int64_t C = 8;  // divisible by the groups
  for (int64_t row_groups : {0, 1, 2}) {
    Rng r;
    const bool batch = row_groups == 0;
    ModelSpec m;
    m.norm = batch             ? NormKind::batchnorm
             : row_groups == 1 ? NormKind::layernorm
                               : NormKind::groupnorm;
    m.norm_groups = row_groups;
    const NormGeometry geo = norm_geometry(m, R, C);
    const int64_t G = geo.G, E = geo.E, gs = geo.gs, es = geo.es;
    auto x = filled(R * C, r, 2.0f);
    Guarded<float> mean(G, true), rstd(G, true);
    auto rm = filled(G, r), rv = filled(G, r);
    for (int64_t g = 0; g < G; ++g) rv.data()[g] += 2.0f;
    check_coverage(
        "NormStats", G,
        kern::NormStats{x.data(), mean.data(), rstd.data(),
                        batch ? rm.data() : nullptr,
                        batch ? rv.data() : nullptr, E, gs, es, 1e-5f, 0.1f},
        batch ? std::vector<Out>{out("mean", mean), out("rstd", rstd),
                                 out("rm", rm), out("rv", rv)}
              : std::vector<Out>{out("mean", mean), out("rstd", rstd)});
    expect_finite("NormStats", rstd);
    auto gamma = filled(C, r), beta = filled(C, r);
    Guarded<float> xh(R * C, true), y(R * C, true);
    check_coverage(
        "NormApply", R * C,
        kern::NormApply{x.data(), mean.data(), rstd.data(), gamma.data(),
                        beta.data(), xh.data(), y.data(), C, row_groups},
        {out("xh", xh), out("y", y)});
    expect_finite("NormApply", y);
    auto dy = filled(R * C, r);
    auto dg = filled(C, r), db = filled(C, r);
    check_coverage(
        "NormAffineGrad", C,
        kern::NormAffineGrad{dy.data(), xh.data(), dg.data(), db.data(), R, C},
        {out("dgamma", dg), out("dbeta", db)});
    Guarded<float> s1(G, true), s2(G, true);
    check_coverage(
        "NormBackwardStats", G,
        kern::NormBackwardStats{dy.data(), xh.data(), gamma.data(), s1.data(),
                                s2.data(), E, gs, es, row_groups},
        {out("s1", s1), out("s2", s2)});
    Guarded<float> dx(R * C, true);
    check_coverage("NormBackwardApply", R * C,
                   kern::NormBackwardApply{dy.data(), xh.data(), gamma.data(),
                                           s1.data(), s2.data(), rstd.data(),
                                           dx.data(), C, row_groups},
                   {out("dx", dx)});
    expect_finite("NormBackwardApply", dx);
  }
}

TEST(KernelCoverage, EmbeddingGrad) {
  Rng r;
  constexpr int64_t V = 3, D = 4, rows = 7;
  auto dh = filled(rows * D, r);
  Guarded<int64_t> tok(rows);
  for (int64_t i = 0; i < rows; ++i) tok.data()[i] = i % V;  // every token
  auto dE = filled(V * D, r);
  check_coverage("EmbeddingGrad", V * D,
                 kern::EmbeddingGrad{dh.data(), tok.data(), dE.data(), rows, D},
                 {out("dE", dE)});
  expect_finite("EmbeddingGrad", dE);
}

// op(X) of a rows x cols operand stored with leading dimension ld (the
// transpose: cols x rows): the elements MatMul reads hold values, the
// padding between rows keeps the guard NaN, so a read off the operand
// shows up as a NaN output.
Guarded<float> operand(int64_t rows, int64_t cols, bool trans, int64_t ld,
                       Rng& r) {
  const int64_t outer = trans ? cols : rows, inner = trans ? rows : cols;
  Guarded<float> g(outer * ld);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) g.data()[o * ld + i] = r.next();
  return g;
}

TEST(KernelCoverage, MatMul) {
  constexpr int64_t K = 3, kPad = 2;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Rng r;
      const int64_t lda = (ta ? R : K) + kPad, ldb = (tb ? K : C) + kPad;
      auto a = operand(R, K, ta, lda, r);
      auto b = operand(K, C, tb, ldb, r);
      Guarded<float> c(R * C, true);
      const kern::MatMul mm{.a = a.data(),
                            .b = b.data(),
                            .c = c.data(),
                            .m = R,
                            .n = C,
                            .k = K,
                            .lda = lda,
                            .ldb = ldb,
                            .ldc = C,
                            .ta = ta,
                            .tb = tb};
      const std::string name = std::string("MatMul ta=") + (ta ? "1" : "0") +
                               " tb=" + (tb ? "1" : "0");
      check_coverage(name.c_str(), R * C, mm, {out("c", c)});
      expect_finite(name.c_str(), c);
    }
}

// The order MatMul writes down, p = 0, 1, ..., k-1, each term one fmaf:
// 2^24 + 1 rounds back to 2^24 (a tie, to even) before -2^24 cancels it,
// so the result is 0; summed from the other end (or any order that adds
// the 1 after the cancellation) it would be 1.
TEST(MatMul, SumsInTheWrittenOrder) {
  const float a[3] = {1.0f, 1.0f, 1.0f};
  const float b[3] = {16777216.0f, 1.0f, -16777216.0f};
  float c = -1.0f;
  const kern::MatMul mm{.a = a,
                        .b = b,
                        .c = &c,
                        .m = 1,
                        .n = 1,
                        .k = 3,
                        .lda = 3,
                        .ldb = 1,
                        .ldc = 1,
                        .ta = false,
                        .tb = false};
  mm(0);
  EXPECT_EQ(c, 0.0f);
  c = -1.0f;
  EmulatedExecutor ex;
  ex.launch(1, mm);
  EXPECT_EQ(c, 0.0f);
}

// Every output of the emulated launch is the bits its thread computes
// alone (the test below runs it on each vector path).
void check_blocks_against_threads() {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},    {1, 300, 7},  {4, 256, 5},
                          {5, 257, 3},  {7, 13, 0},   {9, 520, 33},
                          {32, 10, 64}, {3, 2, 300},  {13, 47, 9},
                          {17, 33, 2},  {40, 64, 17}, {64, 40, 17},
                          {9, 700, 260}};
  EmulatedExecutor ex;
  Rng r;
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            3.0e38f,
                            -3.0e38f};
  int64_t checked = 0;
  for (const Shape& sh : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool special : {false, true}) {
          const int64_t lda = (ta ? sh.m : sh.k) + 1;
          const int64_t ldb = (tb ? sh.k : sh.n) + 3;
          std::vector<float> a(size_t((ta ? sh.k : sh.m) * lda) + 1),
              b(size_t((tb ? sh.n : sh.k) * ldb) + 1);
          for (float& v : a) v = r.next();
          for (float& v : b) v = r.next() * 1e-3f;
          if (special)
            for (size_t i = 0; i < a.size(); i += 5)
              a[i] = specials[(i / 5) % std::size(specials)];
          const int64_t ldc = sh.n + 2;
          std::vector<float> want(size_t(sh.m * ldc), 7.0f), got = want;
          kern::MatMul mm{.a = a.data(),
                          .b = b.data(),
                          .c = want.data(),
                          .m = sh.m,
                          .n = sh.n,
                          .k = sh.k,
                          .lda = lda,
                          .ldb = ldb,
                          .ldc = ldc,
                          .ta = ta,
                          .tb = tb};
          for (int64_t t = 0; t < sh.m * sh.n; ++t) mm(t);
          mm.c = got.data();
          ex.launch(sh.m * sh.n, mm);
          for (size_t i = 0; i < want.size(); ++i) {
            // NaN payloads are not part of the contract (x86 keeps an
            // operand's, a GPU makes the canonical one): NaN is NaN.
            if (std::isnan(want[i]) && std::isnan(got[i])) continue;
            ASSERT_EQ(std::bit_cast<uint32_t>(want[i]),
                      std::bit_cast<uint32_t>(got[i]))
                << sh.m << "x" << sh.n << "x" << sh.k << " ta=" << ta
                << " tb=" << tb << " special=" << special << " at " << i;
          }
          ++checked;
        }
  EXPECT_EQ(checked, int64_t(std::size(shapes)) * 8);
}

// The emulated executor runs MatMul a block of outputs at a time
// (vectorized across outputs, on each vector path this CPU has: generic,
// avx2, avx512): every output must be the bits its thread computes alone,
// for every transpose, for shapes that leave partial row and column blocks
// (rows not a multiple of 8 or 4, columns not of 16 or 32), shapes where
// either orientation wins, k = 0 and 1, and inputs with signed zeros,
// subnormals, infinities and NaN.
TEST(MatMul, EmulatedBlocksAreTheThreadsBits) {
  const std::string path = emulated_detail::matmul_path();
  const std::vector<std::string> paths = emulated_detail::matmul_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), "generic");
  for (const std::string& p : paths) {
    SCOPED_TRACE("path " + p);
    emulated_detail::use_matmul_path(p);
    ASSERT_EQ(emulated_detail::matmul_path(), p);
    check_blocks_against_threads();
  }
  emulated_detail::use_matmul_path(path);
  EXPECT_THROW(emulated_detail::use_matmul_path("avx1024"), InputError);
  EmulatedExecutor ex;
  float c = 0;
  const float one = 1;
  EXPECT_THROW(ex.launch(2, kern::MatMul{.a = &one,
                                         .b = &one,
                                         .c = &c,
                                         .m = 1,
                                         .n = 1,
                                         .k = 1,
                                         .lda = 1,
                                         .ldb = 1,
                                         .ldc = 1,
                                         .ta = false,
                                         .tb = false}),
               std::invalid_argument);
}

}  // namespace
}  // namespace accumcheck
