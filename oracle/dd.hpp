// DD: a double-double number (hi + lo, |lo| <= ulp(hi)/2), 106 significant
// bits (about 32 decimal digits), built from error-free transformations
// (two_sum, two_prod with fma).  No allocation, no global state: the
// number type under Tracked<> for certify's fast bound (oracle/tracked.hpp,
// `certify --bound-arith dd`).
//
// Why 106 bits are enough: the bound is about float32 (u = 2^-24); a value
// rounded at 2^-104 relative per operation (Dekker, Knuth; Joldes, Muller,
// Popescu 2017 give <= 3u^2..6u^2 for these algorithms with u = 2^-53) is
// 80 binary orders inside it, so the bound (err/bound ratios) agrees with
// the 50-digit MPFR oracle's to about 20 decimal digits; tests compare
// them (tests/oracle_dd_test.cpp).
//
// Transcendentals (exp, expm1, log, tanh, erf, sqrt) are computed here to
// the same accuracy (verified against MPFR at 50 digits over their domains
// in tests/oracle_dd_test.cpp: relative error <= 2^-99, about 30 digits;
// measured worst 2^-99.7):
//   exp   x = k ln2 + r, r / 2^9 by a Taylor series, then nine squarings of
//         (1 + s) kept as s (2s + s^2, no cancellation), times 2^k;
//   expm1 the same without the k reduction for |x| < ln2/2;
//   log   one Newton step y + x exp(-y) - 1 from double's log;
//   tanh  expm1(2x) / (expm1(2x) + 2) (no cancellation), 1 - 2 exp(-2x)
//         beyond 40 (where tanh is 1 to 10^-34);
//   erf   (2/sqrt pi) exp(-x^2) sum 2^n x^(2n+1) / (1*3*...*(2n+1)):
//         positive terms, no cancellation; +-1 beyond 10 (erfc(10) <
//         10^-44);
//   sqrt  one Newton step from double's sqrt (Karp-Markstein).
// Non-finite values (inf: Tracked's "unbounded") pass through every
// operation as the plain double result would, never as NaN from the
// error-free transformations' inf - inf.
#pragma once

#include <boost/multiprecision/number.hpp>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <ostream>

// The basic operations are forced inline: called through the Tracked
// templates by the million, they are otherwise left out of line (with
// their arguments through memory) by GCC's inliner.
#define ACCUMCHECK_DD_INLINE [[gnu::always_inline]] inline

namespace accumcheck {

struct DD {
  double hi = 0, lo = 0;

  constexpr DD() = default;
  constexpr DD(double x) : hi(x), lo(0) {}
  constexpr DD(float x) : hi(double(x)), lo(0) {}
  template <std::integral I>
  DD(I x) : hi(double(x)), lo(0) {
    if constexpr (sizeof(I) >= 8)
      lo = double(static_cast<__int128>(x) - static_cast<__int128>(hi));
  }
  // From a multiprecision number (MPFR through Boost): rounded to 106 bits.
  template <class Backend, boost::multiprecision::expression_template_option ET>
  explicit DD(const boost::multiprecision::number<Backend, ET>& x) {
    hi = x.template convert_to<double>();
    if (std::isfinite(hi))
      lo = boost::multiprecision::number<Backend, ET>(x - hi)
               .template convert_to<double>();
  }
  static constexpr DD raw(double h, double l) {
    DD r;
    r.hi = h;
    r.lo = l;
    return r;
  }

  explicit operator double() const { return hi + lo; }
  // Correctly rounded to float (hi alone may sit on a float tie that lo
  // decides).
  ACCUMCHECK_DD_INLINE explicit operator float() const {
    float f = static_cast<float>(hi);
    if (lo == 0 || !std::isfinite(f)) return f;
    const double r = hi - double(f);  // exact (Sterbenz)
    if (r == 0) return f;
    const float nb =
        std::nextafter(f, r > 0 ? std::numeric_limits<float>::infinity()
                                : -std::numeric_limits<float>::infinity());
    const bool tie = 2 * hi == double(f) + double(nb);
    if (tie && ((lo > 0) == (r > 0))) return nb;
    return f;
  }

  ACCUMCHECK_DD_INLINE DD& operator+=(const DD& o) { return *this = *this + o; }
  ACCUMCHECK_DD_INLINE DD& operator-=(const DD& o) { return *this = *this - o; }
  ACCUMCHECK_DD_INLINE DD& operator*=(const DD& o) { return *this = *this * o; }
  ACCUMCHECK_DD_INLINE DD& operator/=(const DD& o) { return *this = *this / o; }

  ACCUMCHECK_DD_INLINE friend DD operator-(const DD& a) {
    return raw(-a.hi, -a.lo);
  }

  // --------------------------------------- error-free transformations
  ACCUMCHECK_DD_INLINE static DD two_sum(double a, double b) {
    const double s = a + b;
    const double bb = s - a;
    return raw(s, (a - (s - bb)) + (b - bb));
  }
  ACCUMCHECK_DD_INLINE static DD quick_two_sum(double a, double b) {
    const double s = a + b;
    return raw(s, b - (s - a));
  }
  ACCUMCHECK_DD_INLINE static DD two_prod(double a, double b) {
    const double p = a * b;
    return raw(p, std::fma(a, b, -p));
  }

  ACCUMCHECK_DD_INLINE friend DD operator+(const DD& a, const DD& b) {
    DD s = two_sum(a.hi, b.hi);
    if (!std::isfinite(s.hi)) return DD(s.hi);
    const DD t = two_sum(a.lo, b.lo);
    s.lo += t.hi;
    s = quick_two_sum(s.hi, s.lo);
    s.lo += t.lo;
    return quick_two_sum(s.hi, s.lo);
  }
  ACCUMCHECK_DD_INLINE friend DD operator-(const DD& a, const DD& b) {
    return a + (-b);
  }
  ACCUMCHECK_DD_INLINE friend DD operator*(const DD& a, const DD& b) {
    DD p = two_prod(a.hi, b.hi);
    if (!std::isfinite(p.hi)) return DD(p.hi);
    p.lo += a.hi * b.lo + a.lo * b.hi;
    return quick_two_sum(p.hi, p.lo);
  }
  ACCUMCHECK_DD_INLINE friend DD operator/(const DD& a, const DD& b) {
    const double q1 = a.hi / b.hi;
    if (!std::isfinite(q1) || !std::isfinite(b.hi)) return DD(q1);
    DD r = a - DD(q1) * b;
    const double q2 = r.hi / b.hi;
    r -= DD(q2) * b;
    const double q3 = r.hi / b.hi;
    return quick_two_sum(q1, q2) + DD(q3);
  }

  ACCUMCHECK_DD_INLINE friend bool operator==(const DD& a, const DD& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  ACCUMCHECK_DD_INLINE friend bool operator<(const DD& a, const DD& b) {
    return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
  }
  ACCUMCHECK_DD_INLINE friend bool operator>(const DD& a, const DD& b) {
    return b < a;
  }
  ACCUMCHECK_DD_INLINE friend bool operator<=(const DD& a, const DD& b) {
    return a < b || a == b;
  }
  ACCUMCHECK_DD_INLINE friend bool operator>=(const DD& a, const DD& b) {
    return b <= a;
  }

  ACCUMCHECK_DD_INLINE friend DD abs(const DD& a) { return a.hi < 0 ? -a : a; }
  friend DD ldexp(const DD& a, int k) {
    return raw(std::ldexp(a.hi, k), std::ldexp(a.lo, k));
  }
  friend DD sqrt(const DD& a);
  friend DD exp(const DD& a);
  friend DD expm1(const DD& a);
  friend DD log(const DD& a);
  friend DD tanh(const DD& a);
  friend DD erf(const DD& a);

  friend std::ostream& operator<<(std::ostream& os, const DD& x) {
    return os << x.hi << (x.lo < 0 ? "" : "+") << x.lo;
  }
};

inline bool isfinite(const DD& a) { return std::isfinite(a.hi); }

namespace dd_detail {

// exp(r) - 1 for |r| <= ln2/2: r / 2^9, Taylor to r^10 / 10!, then
// (1 + s)^2 - 1 = 2s + s^2 nine times (no cancellation).
DD expm1_reduced(const DD& r);
// 1/k! for k = 0..10, rounded to DD (expm1_reduced's coefficients).
const DD* inverse_factorials();
const DD& ln2();
const DD& two_over_sqrt_pi();

}  // namespace dd_detail

ACCUMCHECK_DD_INLINE DD sqrt(const DD& a) {
  if (a.hi <= 0 || !std::isfinite(a.hi)) return DD(std::sqrt(a.hi));
  const double x = 1.0 / std::sqrt(a.hi);
  const double ax = a.hi * x;
  const DD sq = DD::two_prod(ax, ax);
  return DD::two_sum(ax, (a - sq).hi * (x * 0.5));
}

}  // namespace accumcheck

template <>
class std::numeric_limits<accumcheck::DD> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 106;
  static constexpr int digits10 = 31;
  static constexpr accumcheck::DD infinity() {
    return accumcheck::DD(std::numeric_limits<double>::infinity());
  }
  static constexpr accumcheck::DD quiet_NaN() {
    return accumcheck::DD(std::numeric_limits<double>::quiet_NaN());
  }
  static constexpr accumcheck::DD epsilon() { return accumcheck::DD(0x1p-104); }
};
