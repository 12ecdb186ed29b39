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
#include <vector>

#include "oracle/dd_lanes.hpp"
#include "oracle/layers.hpp"

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
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(same_bits(got[i], want[i]))
                << "kind " << kind << " B " << B << " in " << in << " out "
                << out_dim << " element " << i << ": " << got[i] << " vs "
                << want[i];
            (want[i].e.hi == 0 ? exact : bounded) += 1;
          }
        }
  // Both the exact case (bound 0) and the bounded one were met.
  EXPECT_GT(exact, 0);
  EXPECT_GT(bounded, 0);
}

TEST(DDLanes, WeightGradMatchesDotInto) {
  int exact = 0;
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
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(same_bits(got[i], want[i]))
                << "kind " << kind << " B " << B << " in " << in << " out "
                << out_dim << " element " << i << ": " << got[i] << " vs "
                << want[i];
            exact += want[i].e.hi == 0;
          }
        }
  EXPECT_GT(exact, 0);
}

}  // namespace
}  // namespace accumcheck
