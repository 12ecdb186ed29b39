// The Tracked<DD> kernels four elements at a time (oracle/dd_lanes.hpp)
// against the scalar code they stand for, bit for bit: values and bounds
// of Linear forward and the weight gradient against dot_into's, over
// shapes with and without a remainder, inputs exact and inexact, exact
// sums (bound 0), zeros and non-finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oracle/dd_lanes.hpp"
#include "oracle/error_model.hpp"
#include "oracle/layers.hpp"
#include "oracle/oracle.hpp"
#include "sim/layout.hpp"

namespace accumcheck {
namespace {

using TD = Tracked<DD>;

// The same doubles (a NaN's sign and payload aside: the compiler may
// commute a commutative operation's operands at one call site and not at
// another, and x86 passes on the first operand's NaN).
bool same_bits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}
bool same_bits(const TD& a, const TD& b) {
  return same_bits(a.v.hi, b.v.hi) && same_bits(a.v.lo, b.v.lo) &&
         same_bits(a.e.hi, b.e.hi) && same_bits(a.e.lo, b.e.lo);
}

// Values of a kind: 0 exact dyadic (small integers / 8, bound 0), 1 float
// (bound 0), 2 DD with a bound, 3 a mix of all with zeros, 4 the mix with
// an occasional non-finite value or bound.
struct Gen {
  std::mt19937_64 rng;
  int kind;
  Gen(uint64_t seed, int k) : rng(seed), kind(k) {}
  double U() { return std::uniform_real_distribution<double>(-1, 1)(rng); }
  TD next() {
    int k = kind;
    if (k >= 3) {
      const int r = int(rng() % 16);
      if (r == 0) return TD(DD(0.0), DD(0.0));
      if (k == 4 && r == 1)
        return TD(DD(std::numeric_limits<double>::infinity()), DD(0.0));
      if (k == 4 && r == 2)
        return TD(DD(U()), DD(std::numeric_limits<double>::infinity()));
      k = r % 3;
    }
    if (k == 0) return TD(DD(double(int(rng() % 17) - 8) / 8), DD(0.0));
    if (k == 1) return TD(DD(double(float(U()))), DD(0.0));
    const double h = U();
    return TD(DD::quick_two_sum(h, h * 0x1p-60 * U()),
              DD(std::fabs(h) * 0x1p-24 * (1 + U())));
  }
  std::vector<TD> vec(int64_t n) {
    std::vector<TD> v(static_cast<size_t>(n));
    for (TD& x : v) x = next();
    return v;
  }
};

// Whether every element of `got` has `want`'s bits (a failure says which,
// with the case `where`); counts the elements whose want is exact (bound 0)
// and bounded.
::testing::AssertionResult all_same_bits(const std::vector<TD>& got,
                                         const std::vector<TD>& want,
                                         const std::string& where, int& exact,
                                         int& bounded) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!same_bits(got[i], want[i]))
      return ::testing::AssertionFailure() << where << " element " << i << ": "
                                           << got[i] << " vs " << want[i];
    (want[i].e.hi == 0 ? exact : bounded) += 1;
  }
  return ::testing::AssertionSuccess();
}

// "kind K B b in i out o", the case of a message.
std::string shape(int kind, int64_t B, int64_t in, int64_t out_dim) {
  return "kind " + std::to_string(kind) + " B " + std::to_string(B) + " in " +
         std::to_string(in) + " out " + std::to_string(out_dim);
}

TEST(DDLanes, LinearForwardMatchesDotInto) {
  int exact = 0, bounded = 0;
  for (int kind = 0; kind <= 4; ++kind)
    for (int64_t B : {1, 3, 4, 5, 8})
      for (int64_t in : {1, 3, 4, 7, 33})
        for (int64_t out_dim : {1, 5}) {
          Gen g(uint64_t(kind * 1000 + B * 100 + in * 10 + out_dim), kind);
          const auto inp = g.vec(B * in), W = g.vec(out_dim * in),
                     bias = g.vec(out_dim);
          std::vector<TD> got(size_t(B * out_dim)), want(got.size());
          dd_lanes::linear_forward(got.data(), inp.data(), W.data(),
                                   bias.data(), B, in, out_dim);
          for (int64_t b = 0; b < B; ++b)
            for (int64_t o = 0; o < out_dim; ++o)
              dot_into(want[size_t(b * out_dim + o)], &bias[size_t(o)], in,
                       &W[size_t(o * in)], 1, &inp[size_t(b * in)], 1);
          ASSERT_TRUE(all_same_bits(got, want, shape(kind, B, in, out_dim),
                                    exact, bounded));
        }
  // Both the exact case (bound 0) and the bounded one were met.
  EXPECT_GT(exact, 0);
  EXPECT_GT(bounded, 0);
}

TEST(DDLanes, WeightGradMatchesDotInto) {
  int exact = 0, bounded = 0;
  for (int kind = 0; kind <= 4; ++kind)
    for (int64_t B : {1, 3, 4, 5})
      for (int64_t in : {1, 3, 4, 7, 33})
        for (int64_t out_dim : {1, 5}) {
          Gen g(uint64_t(kind * 1000 + B * 100 + in * 10 + out_dim + 7), kind);
          const auto inp = g.vec(B * in), dout = g.vec(B * out_dim);
          const auto dW0 = g.vec(out_dim * in);
          std::vector<TD> got = dW0, want = dW0;
          dd_lanes::weight_grad(got.data(), dout.data(), inp.data(), B, in,
                                out_dim);
          for (int64_t o = 0; o < out_dim; ++o)
            for (int64_t i = 0; i < in; ++i)
              dot_into(want[size_t(o * in + i)], &want[size_t(o * in + i)], B,
                       &dout[size_t(o)], out_dim, &inp[size_t(i)], in);
          ASSERT_TRUE(all_same_bits(got, want, shape(kind, B, in, out_dim),
                                    exact, bounded));
        }
  EXPECT_GT(exact, 0);
}

TEST(DDLanes, InputGradMatchesDotInto) {
  int exact = 0, bounded = 0;
  for (int kind = 0; kind <= 4; ++kind)
    for (int64_t B : {1, 3, 4, 5, 8})
      for (int64_t in : {1, 3, 5})
        for (int64_t out_dim : {1, 4, 17}) {
          Gen g(uint64_t(kind * 1000 + B * 100 + in * 10 + out_dim + 3), kind);
          const auto dout = g.vec(B * out_dim), W = g.vec(out_dim * in);
          std::vector<TD> got(size_t(B * in)), want(got.size());
          dd_lanes::input_grad(got.data(), dout.data(), W.data(), B, in,
                               out_dim);
          for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < in; ++i)
              dot_into(want[size_t(b * in + i)],
                       static_cast<const TD*>(nullptr), out_dim,
                       &dout[size_t(b * out_dim)], 1, &W[size_t(i)], in);
          ASSERT_TRUE(all_same_bits(got, want, shape(kind, B, in, out_dim),
                                    exact, bounded));
        }
  EXPECT_GT(exact, 0);
  EXPECT_GT(bounded, 0);
}

// Adam's scalars as Oracle::optimizer_step forms them; variant 0: Adam,
// 1: Adam with (coupled) weight decay, 2: AdamW.
AdamScalars<TD> adam_scalars(int variant, int64_t step) {
  OptimizerSpec o;
  o.kind = variant == 2 ? OptimizerKind::adamw : OptimizerKind::adam;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.weight_decay = variant == 0 ? 0.0 : 0.01;
  return accumcheck::adam_scalars<TD>(o, 1e-3, step);
}

TEST(DDLanes, AdamStepMatchesScalarLoop) {
  int lanes_path = 0;
  for (int kind = 2; kind <= 4; ++kind)
    for (int variant = 0; variant < 3; ++variant)
      for (int64_t n : {1, 3, 4, 7, 8, 13, 64})
        for (int mode = 0; mode < 4; ++mode) {
          const bool fresh = mode & 1, exact_grad = mode & 2;
          Gen g(uint64_t(kind * 1000 + variant * 100 + n + mode * 7), kind);
          const auto p0 = g.vec(n);
          auto grad = g.vec(n);
          std::vector<TD> m0 = g.vec(n), v0 = g.vec(n);
          for (TD& x : v0) x = TD(abs(x.v), x.e);
          if (exact_grad)  // certify's case: the recorded float gradients
            for (TD& x : grad) x = TD(DD(double(float(x.v.hi))), DD(0.0));
          if (fresh)  // the first step: m = v = 0 exactly
            for (int64_t i = 0; i < n; ++i)
              m0[size_t(i)] = v0[size_t(i)] = TD(DD(0.0), DD(0.0));
          AdamScalars<TD> s = adam_scalars(variant, fresh ? 1 : 5);
          std::vector<TD> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
          TD g1(0.f), t1(0.f), g2(0.f), t2(0.f);
          dd_lanes::adam_step(n, p1.data(), grad.data(), m1.data(), v1.data(),
                              s, g1, t1);
          layers_detail::adam_loop(n, p2.data(), grad.data(), m2.data(),
                                   v2.data(), s, g2, t2);
          for (size_t i = 0; i < size_t(n); ++i) {
            ASSERT_TRUE(same_bits(p1[i], p2[i]) && same_bits(m1[i], m2[i]) &&
                        same_bits(v1[i], v2[i]))
                << "kind " << kind << " variant " << variant << " n " << n
                << " mode " << mode << " element " << i << ": p " << p1[i]
                << " vs " << p2[i] << ", m " << m1[i] << " vs " << m2[i]
                << ", v " << v1[i] << " vs " << v2[i];
          }
          ASSERT_TRUE(same_bits(g1, g2) && same_bits(t1, t2));
          lanes_path += kind == 2 && n >= 4;
        }
  EXPECT_GT(lanes_path, 0);
}

// error_model::compare with its lanes (compare_lanes) against the scalar
// code alone: the same Comparison, every double bit for bit, on values
// with zero, infinite and NaN parts, bounds of zero, subnormal and
// infinite size, results on either side of the bound, with and without a
// layout, float and double results.
::testing::AssertionResult same_comparison(const error_model::Comparison& a,
                                           const error_model::Comparison& b) {
  auto fail = [](const char* what) {
    return ::testing::AssertionFailure() << what << " differs";
  };
  if (a.n != b.n || a.violations != b.violations) return fail("n/violations");
  if (a.worst.index != b.worst.index || a.worst.tensor != b.worst.tensor)
    return fail("worst element");
  for (auto [x, y] : {std::pair{a.worst.f, b.worst.f},
                      {a.worst.v, b.worst.v},
                      {a.worst.err, b.worst.err},
                      {a.worst.bound, b.worst.bound},
                      {a.worst.ratio, b.worst.ratio},
                      {a.max_err_u, b.max_err_u},
                      {a.rms_err_u, b.rms_err_u},
                      {a.max_ratio, b.max_ratio}})
    if (!same_bits(x, y))
      return fail("a statistic") << ": " << x << " vs " << y;
  if (a.tensor_ratio.size() != b.tensor_ratio.size()) return fail("tensors");
  for (size_t i = 0; i < a.tensor_ratio.size(); ++i)
    if (a.tensor_ratio[i].first != b.tensor_ratio[i].first ||
        !same_bits(a.tensor_ratio[i].second, b.tensor_ratio[i].second))
      return fail("a tensor's ratio");
  return ::testing::AssertionSuccess();
}

TEST(DDLanes, CompareMatchesScalarCode) {
  ModelSpec spec;
  spec.widths = {5, 7, 3};  // tensors of 35, 7, 21 and 3 elements
  const ParamLayout layout = layout_of(spec);
  const int64_t n = layout.total;
  int violated = 0, within = 0, scalar_lanes = 0;
  for (int kind = 2; kind <= 4; ++kind)
    for (int seed = 0; seed < 40; ++seed) {
      Gen g(uint64_t(kind * 7919 + seed), kind);
      std::vector<TD> v = g.vec(n);
      std::vector<float> f(static_cast<size_t>(n));
      for (size_t i = 0; i < size_t(n); ++i) {
        const double x = v[i].v.hi;
        const bool calm = seed % 2 == 1;  // every result within its bound
        if (calm && std::isfinite(x))
          v[i].e = DD(std::max(v[i].e.hi, std::fabs(x) * 0x1p-20));
        const double e = v[i].e.hi;
        // Results at 0 .. 2 x the bound away (calm: 0 .. 1/2 x), some
        // exact, some far off.
        const int r = calm ? int(g.rng() % 2) * 4 : int(g.rng() % 8);
        double y = x + (r == 0 ? 0.0 : e * g.U() * (calm ? 0.5 : 2));
        if (r == 1) y = x * (1 + 1e-3);
        if (r == 2 && kind == 4) y = std::numeric_limits<double>::quiet_NaN();
        if (r == 3 && seed % 5 == 0) v[i].e = DD(0x1p-1070);  // subnormal
        f[i] = float(y);
      }
      if (seed % 7 == 2) v[5].e = DD::raw(1e-9, 1e-30);  // a bound's low part
      const std::vector<double> fd(f.begin(), f.end());
      for (const ParamLayout* L : {&layout, (const ParamLayout*)nullptr})
        for (double scale : {1.0, 3.0}) {
          const auto lanes =
              error_model::compare<float, TD, true>("x", f, v, L, 1.0, scale);
          const auto ref =
              error_model::compare<float, TD, false>("x", f, v, L, 1.0, scale);
          ASSERT_TRUE(same_comparison(lanes, ref))
              << "kind " << kind << " seed " << seed << " scale " << scale;
          ASSERT_TRUE(same_comparison(
              error_model::compare<double, TD, true>("x", fd, v, L, 2.0, scale),
              error_model::compare<double, TD, false>("x", fd, v, L, 2.0,
                                                      scale)));
          (lanes.violations > 0 ? violated : within) += 1;
        }
      for (int64_t i = 0; i + 4 <= n; i += 4) {
        error_model::CompareLanes cl;
        error_model::compare_lanes(&f[size_t(i)], &v[size_t(i)], 1.0, 1.0, cl);
        scalar_lanes += cl.scalar != 0;
      }
    }
  EXPECT_GT(violated, 0);
  EXPECT_GT(within, 0);
  EXPECT_GT(scalar_lanes, 0);
}

// certify's cheap proxy comparison (error_model::compare_proxy, the
// elements that raise no maximum counted in registers) against
// accumulate() element by element, as certify judged before it: every
// statistic bit for bit, with and without a layout, on values from exact
// to far off, rising ratios (a new worst mid-tensor), zeros, infinities
// and NaN on either side.
TEST(ErrorModel, ProxyComparisonIsAccumulateElementwise) {
  ModelSpec spec;
  spec.widths = {5, 7, 3};  // tensors of 35, 7, 21 and 3 elements
  const ParamLayout layout = layout_of(spec);
  const size_t n = size_t(layout.total);
  const double ulps = 64, k = ulps * error_model::kUnitRoundoff32;
  const double inf = std::numeric_limits<double>::infinity();
  int new_worst_inside = 0, violated = 0;
  for (int seed = 0; seed < 200; ++seed) {
    Gen g(uint64_t(seed * 104729 + 7), 1 + seed % 4);
    std::vector<double> v(n), f(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = (g.U() - 0.5) * std::ldexp(1.0, int(g.rng() % 40) - 20);
      const int r = int(g.rng() % 10);
      const double step = r < 4 ? 0.0 : r < 7 ? 1e-9 : r < 9 ? 1e-5 : 1e-2;
      // Rising: later elements further off, so the worst moves inside a
      // tensor; else at random.
      const double rise = seed % 3 == 0 ? double(i + 1) / double(n) : g.U();
      f[i] = v[i] * (1 + step * rise);
      if (seed % 11 == 3 && i == n / 2) v[i] = 0;
      if (seed % 13 == 4 && i == 9) f[i] = std::nan("");
      if (seed % 17 == 5 && i == 40) v[i] = inf;
      if (seed % 19 == 6 && i == 12) f[i] = -inf;
    }
    for (const ParamLayout* L : {&layout, (const ParamLayout*)nullptr}) {
      error_model::Comparison ref;
      ref.what = "x";
      double maxabs = 0;
      for (double x : v) maxabs = std::max(maxabs, std::fabs(x));
      for (size_t i = 0; i < n; ++i) {
        const double err = std::fabs(f[i] - v[i]);
        const double bound =
            k * (std::fabs(v[i]) + std::ldexp(maxabs, -10)) + 1e-300;
        error_model::accumulate(ref, L, int64_t(i), f[i], v[i], err, bound,
                                err / bound, err > bound);
      }
      const auto got = error_model::compare_proxy("x", f, v, L, ulps);
      ASSERT_TRUE(same_comparison(got, ref)) << "seed " << seed;
      violated += ref.violations > 0;
      new_worst_inside += ref.worst.index > 0 && ref.worst.index != 35 &&
                          ref.worst.index != 42 && ref.worst.index != 63;
    }
  }
  EXPECT_GT(violated, 0);
  EXPECT_GT(new_worst_inside, 0);
}

// tanh_forward (the DD values four at a time) against the scalar Tracked
// tanh, bit for bit: both of expm1's branches and the boundary between
// them, exp's reduction over its range, |x| > 40, NaN, infinities, signed
// zeros, subnormals, bounds from 0 to infinite; in place too.
// An elementwise lanes kernel `lanes` against the scalar `one`, bit for
// bit, on the first n of x for n = 1, 3, 4, 12 (a group of eight and one
// of four) and all, and in place.
template <class Lanes, class One>
void elementwise_matches(const std::vector<TD>& x, Lanes lanes, One one) {
  for (int64_t n :
       {int64_t(1), int64_t(3), int64_t(4), int64_t(12), int64_t(x.size())}) {
    std::vector<TD> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    lanes(got.data(), x.data(), n);
    for (size_t i = 0; i < size_t(n); ++i) want[i] = one(x[i]);
    int exact = 0, bounded = 0;
    ASSERT_TRUE(
        all_same_bits(got, want, "n " + std::to_string(n), exact, bounded));
    std::vector<TD> in_place(x.begin(), x.begin() + n);
    lanes(in_place.data(), in_place.data(), n);
    ASSERT_TRUE(all_same_bits(in_place, want, "in place", exact, bounded));
  }
}

TEST(DDLanes, TanhForwardMatchesScalar) {
  std::mt19937_64 rng(17);
  auto U = [&] { return std::uniform_real_distribution<double>(-1, 1)(rng); };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<TD> x;
  for (int i = 0; i < 4000; ++i) {
    const int r = int(rng() % 10);
    double h = r < 3   ? U() * 0.3  // expm1_reduced directly
               : r < 6 ? U() * 12   // exp's reduction
               : r < 7
                   ? std::copysign(0.17, U()) * (1 + U() * 1e-6)  // the seam
               : r < 8 ? U() * 90                                 // past 40 too
               : r < 9 ? U() * 1e-3
                       : U() * 1e-9;  // tanh's slope bound clamped at 1
    if (i % 97 == 0) h = std::numeric_limits<double>::quiet_NaN();
    if (i % 89 == 0) h = (i % 2 ? inf : -inf);
    if (i % 83 == 0) h = (i % 2 ? 0.0 : -0.0);
    if (i % 79 == 0) h = 0x1p-1060;
    // Bounds from 2^-21 of |x| to about |x| (the slope's interval, its
    // clamps and tanh_bound's y > 2^-10 cut-off), some absolute ones, and
    // some with a low part.
    const double e = rng() % 5 == 0 ? 0.0
                     : i % 71 == 0  ? inf
                     : i % 13 == 0  ? 0.05 * (1 + U())
                                    : std::fabs(h) * (1 + U()) *
                                         std::ldexp(1.0, -7 * int(rng() % 4));
    x.push_back(TD(DD::quick_two_sum(h, h * 0x1p-60 * U()),
                   i % 31 == 0 ? DD::raw(e, e * 0x1p-60) : DD(e)));
  }
  elementwise_matches(x, dd_lanes::tanh_forward,
                      [](const TD& v) { return tanh(v); });
}

// dd_lanes::exp_forward against Tracked's exp, element by element: the
// softmax's range (x <= 0) and beyond, exp's limits (709.7, -745.2) and
// the powers of two below the normal doubles, NaN, infinities, zeros;
// bounds from 0 to infinite, across exp_bound's 2^-10 cut-off; in place
// too; groups of eight, of four and the rest.
TEST(DDLanes, ExpForwardMatchesScalar) {
  std::mt19937_64 rng(23);
  auto U = [&] { return std::uniform_real_distribution<double>(-1, 1)(rng); };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<TD> x;
  for (int i = 0; i < 4000; ++i) {
    const int r = int(rng() % 8);
    double h = r < 2   ? U() * 0.3
               : r < 4 ? -std::fabs(U()) * 30        // a softmax's inputs
               : r < 5 ? U() * 750                   // past both limits
               : r < 6 ? -709 - std::fabs(U()) * 37  // 2^k subnormal
               : r < 7 ? U() * 1e-9
                       : std::copysign(709.7, U()) + U() * 1e-3;
    if (i % 97 == 0) h = std::numeric_limits<double>::quiet_NaN();
    if (i % 89 == 0) h = (i % 2 ? inf : -inf);
    if (i % 83 == 0) h = (i % 2 ? 0.0 : -0.0);
    const double e = rng() % 5 == 0 ? 0.0
                     : i % 71 == 0  ? inf
                     : i % 13 == 0  ? 0x1p-10 * (1 + U())
                                    : std::fabs(h) * (1 + U()) * 0x1p-22;
    x.push_back(TD(DD::quick_two_sum(h, h * 0x1p-60 * U()),
                   i % 31 == 0 ? DD::raw(e, e * 0x1p-60) : DD(e)));
  }
  elementwise_matches(x, dd_lanes::exp_forward,
                      [](const TD& v) { return exp(v); });
}

}  // namespace
}  // namespace accumcheck
