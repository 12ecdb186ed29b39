// DD's transcendental functions (oracle/dd.hpp says how and how accurate).
#include "oracle/dd.hpp"

#include <bit>
#include <boost/multiprecision/mpfr.hpp>
#include <cstdint>

namespace accumcheck {

namespace dd_detail {

namespace {
using Mp =
    boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<50>,
                                  boost::multiprecision::et_off>;
}  // namespace

const DD& ln2() {
  static const DD k(Mp(log(Mp(2))));
  return k;
}
const DD& two_over_sqrt_pi() {
  static const DD k(Mp(Mp(2) / sqrt(Mp(boost::multiprecision::acos(Mp(-1))))));
  return k;
}

namespace {
// 1/k! for k = 0..10, rounded to DD.
struct InverseFactorials {
  DD v[11];
  InverseFactorials() {
    Mp f(1);
    for (int k = 0; k <= 10; ++k) {
      if (k > 0) f *= k;
      v[k] = DD(Mp(Mp(1) / f));
    }
  }
};
}  // namespace

const DD* inverse_factorials() {
  static const InverseFactorials k;
  return k.v;
}

DD expm1_reduced(const DD& r) {
  // |r| <= ln2/2 = 0.347: r / 512 <= 6.8e-4; the Taylor remainder after
  // r^10/10! is < (6.8e-4)^11 / 11! ~ 4e-43, far below 2^-106 |r/512|.
  // Scalings by 2^-9 and 2 are exact (or correctly rounded, the same as
  // ldexp) as multiplications: no libm call per step.
  const DD x = DD::raw(r.hi * 0x1p-9, r.lo * 0x1p-9);
  // Horner: s = x (1 + x/2! (1 + ...)) as sum x^k / k!, k = 1..10.
  const DD* f = inverse_factorials();
  DD s = f[10];
  for (int k = 9; k >= 1; --k) s = f[k] + x * s;
  s = x * s;
  for (int i = 0; i < 9; ++i) s = DD::raw(s.hi * 2, s.lo * 2) + s * s;
  return s;
}

}  // namespace dd_detail

namespace {
// ldexp(a, k) as a multiplication by 2^k (the same correctly rounded
// result) where 2^k is a normal double, without a libm call.
DD times_pow2(const DD& a, int k) {
  if (k < -1022 || k > 1023) return ldexp(a, k);
  const double p = std::bit_cast<double>(uint64_t(k + 1023) << 52);
  return DD::raw(a.hi * p, a.lo * p);
}
DD twice(const DD& a) { return DD::raw(a.hi * 2, a.lo * 2); }
}  // namespace

DD exp(const DD& a) {
  if (a.hi > 709.7) return DD(std::numeric_limits<double>::infinity());
  if (a.hi < -745.2) return DD(0.0);
  if (std::isnan(a.hi)) return a;
  const double k = std::nearbyint(a.hi / dd_detail::ln2().hi);
  const DD r = a - dd_detail::ln2() * DD(k);
  const DD s = dd_detail::expm1_reduced(r);
  return times_pow2(s + DD(1), int(k));
}

DD expm1(const DD& a) {
  if (std::fabs(a.hi) > 0.34) return exp(a) - DD(1);
  return dd_detail::expm1_reduced(a);
}

DD log(const DD& a) {
  if (!(a.hi > 0) || !std::isfinite(a.hi)) return DD(std::log(a.hi));
  // Newton on exp(y) = a: y + a exp(-y) - 1; doubles the digits of
  // double's log (the correction is computed in DD).
  const DD y(std::log(a.hi));
  return y + a * exp(-y) - DD(1);
}

DD tanh(const DD& a) {
  if (std::isnan(a.hi)) return a;
  const bool neg = a.hi < 0;
  const DD x = neg ? -a : a;
  DD t;
  if (x.hi > 40) {
    t = DD(1) - twice(exp(twice(-x)));
  } else {
    const DD m = expm1(twice(x));
    t = m / (m + DD(2));
  }
  return neg ? -t : t;
}

DD erf(const DD& a) {
  if (std::isnan(a.hi)) return a;
  const bool neg = a.hi < 0;
  const DD x = neg ? -a : a;
  if (x.hi >= 10) return DD(neg ? -1.0 : 1.0);
  if (x.hi == 0) return DD(0.0);
  // (2/sqrt pi) exp(-x^2) sum_n t_n,  t_0 = x, t_{n+1} = t_n 2x^2/(2n+3):
  // every term positive; stop when a term no longer moves the sum.
  const DD x2 = x * x;
  const DD two_x2 = ldexp(x2, 1);
  DD t = x, sum = x;
  for (int n = 0; n < 2000; ++n) {
    t = t * two_x2 / DD(double(2 * n + 3));
    sum += t;
    if (t.hi < sum.hi * 0x1p-110) break;
  }
  DD r = dd_detail::two_over_sqrt_pi() * exp(-x2) * sum;
  if (r.hi > 1) r = DD(1);
  return neg ? -r : r;
}

}  // namespace accumcheck
