// Tracked<B>: a value in high precision together with a rigorous bound on
// how far a float32 implementation of the same computation can be from it.
//
//   v  the oracle's value (B = OracleReal: 50 digits, "exact")
//   e  a bound on |f - v|, where f is what a float32 engine computes for
//      the same expression from the same float32-exact inputs.
//
// Running Oracle<Tracked<OracleReal>> (oracle/oracle.hpp) over one pass
// (forward, backward, accumulation over micro-batches with +=, clipping,
// one optimizer step) from a float32-exact state gives, per element of
// every tensor, the tolerance a float32 engine must meet: derived, never
// guessed.
//
// DERIVATION (u = 2^-24, the unit roundoff of float32; round to nearest;
// every float32 operation o gives fl(x o y) = (x o y)(1 + d), |d| <= u,
// plus an absolute eta = 2^-150 when the result is subnormal; fa, fb are
// the engine's values, a, b the oracle's, |fa - a| <= ea, |fb - b| <= eb):
//
//   from double x  e = |x - (float)x|: the engine rounds hyperparameters
//                  once; float32-exact data gets e = 0.
//   a + b          |fl(fa + fb) - (a + b)| <= (ea + eb) + u |fa + fb|
//                     <= (ea + eb)(1 + u) + u |a + b|
//   a * b          |fa fb - a b| <= |a| eb + |b| ea + ea eb =: P
//                  e = P (1 + u) + u |a b| + eta
//   a / b          (eb < |b|, else e = inf: the divisor may be 0)
//                  |fa/fb - a/b| = |(fa - a) b - a (fb - b)| / (|fb| |b|)
//                     <= (ea + |a/b| eb) / (|b| - eb) =: D
//                  e = D (1 + u) + u |a/b| + eta
//   sqrt x         |sqrt fx - sqrt x| = |fx - x| / (sqrt fx + sqrt x)
//                     <= min(ex / sqrt x, sqrt ex) =: S  (both rigorous)
//                  e = S (1 + u) + u sqrt x
//   -a, |a|        exact: e passes through.
//   EXACT OPERATIONS: when ea = eb = 0 and the exact result is a float32
//   number, IEEE correct rounding returns it exactly: e = 0.  This keeps
//   the dyadic ("bitwise") tier at bound 0, i.e. exact equality required.
//
//   Transcendentals, with the device's own promised accuracy
//   (oracle/error_model.hpp), for an input fx within ex of x:
//   exp x          |exp fx - exp x| <= exp(x) expm1(ex) =: X
//                  e = X + kExpUlp u (exp x + X)          (|x| <= 87)
//   log x          (ex < x, else inf) |log fx - log x| <= ex/(x - ex) =: L
//                  e = L + kLogUlp u max(1, |log x| + L)
//   tanh x         the slope 1 - tanh^2 is largest where the interval
//                  [x - ex, x + ex] comes closest to 0 (distance m):
//                  T = min(ex (1 - tanh(m)^2), 2)
//                  e = T + kTanhUlp u (|tanh x| + T)
//   erf x          slope (2/sqrt pi) exp(-t^2), largest at distance m:
//                  R = min(ex (2/sqrt pi) exp(-m^2), 2)
//                  e = R + kErfUlp u (|erf x| + R)
//   relu, branches branch_positive(x, a, b) = x > 0 ? a : b.  If the sign
//                  of fx is certain (|x| > ex, or ex = 0) the chosen branch's
//                  e passes through; otherwise the engine may take the other
//                  branch: e = max(e_chosen, |v_chosen - v_other| + e_other).
//                  relu(x) = branch_positive(x, x, 0) gives e = ex
//                  (relu is 1-Lipschitz).
//   max            max is 1-Lipschitz in the max norm: e = max_k e_k.
//
//   REDUCTIONS (dot_into, sum_into), order-independent (BLAS, any order,
//   with or without FMA; Higham, Accuracy and Stability, Thm 3.1 / 3.5):
//   for m = n (+1 with an initial value c) terms,
//     gamma = m u / (1 - m u)  (inf if m u >= 1),
//     P = e_c + sum (|a_k| eb_k + |b_k| ea_k + ea_k eb_k),
//     M = |c| + sum |a_k b_k|,
//     e = P (1 + gamma) + gamma M + n eta,
//   since the computed sum of the engine's own products is within
//   gamma * sum |fa fb| <= gamma (M + P) of their exact sum, itself within
//   P of the oracle's.  A sum of m terms uses gamma_{m-1}.  Exact case:
//   all inputs exact, every product a float32 number, and all of them (and
//   c) multiples of 2^k with sum |.| < 2^(k+24): then every partial sum in
//   any order is a float32 number and e = 0.
//
//   Host scalars (Num<Tracked>::from_host): computed in double by the host
//   (PyTorch: lr/(1 - b1^t), sqrt(1 - b2^t), 1 - lr*wd) and rounded once to
//   float: e = u |x| (rounding u/2 plus double-side error <= u/2, which
//   holds while t <= 2^28 (1 - beta)).  Constants the device stores in
//   float (1/sqrt 2, 1/sqrt(2 pi)): e = |x - (float)x|.
//
//   Comparisons (<, >, ...) use the value; a decision near its threshold
//   (clip's coef < 1) is the caller's to avoid (DESIGN.md section 2).
//
//   Caveats.  The bound is for the engine evaluating each formula with the
//   same roundings as the oracle's code (oracle/oracle.hpp spells each one
//   out), or fewer (an FMA in place of a multiply and an add is covered).
//   The e arithmetic is itself done in B at >= 50 digits; its own rounding
//   (relative 1e-50) is far inside the (1 + u) factors kept above.
//
//   B = DD (double-double, oracle/dd.hpp; `certify --bound-arith dd`): the
//   same formulas at 106 bits; v and e round at about 2^-104 relative per
//   operation, again some 80 binary orders inside the (1 + u) factors, and
//   the transcendentals (exp, expm1, log, tanh, erf, sqrt) are DD-accurate
//   too (<= 2^-99 relative, tested against MPFR), so the bounds of the
//   slopes above (tanh(m), exp(-m^2), expm1(ex)) keep their meaning.  The
//   reductions, nearly all of the time, are specialized below: the
//   products' value is summed by compensated summation (Ogita, Rump and
//   Oishi's Dot2: error <= 2^-53 |sum| + gamma_n(2^-53)^2 sum |terms|),
//   the nonnegative sums P and M are formed in double from the DD high
//   parts and then multiplied by (1 + (n + 16) 2^-52), which covers every
//   rounding of theirs and the high parts' own 2^-53 (a sum of n
//   nonnegative doubles is within (1 + 2^-53)^n of exact), and the
//   compensated sum's own error bound is added to e, so the DD bound is
//   rigorous by itself and >= the exact-arithmetic one.
//   tanh's slope bound, for DD, needs no tanh of m (a second DD tanh per
//   unit): with a = |x| > e = ex (else m = 0 and the slope bound is 1),
//   m = a - e, and t = tanh a, already computed as the value,
//     log sech^2 m - log sech^2 a = 2 int_m^a tanh <= 2 e tanh(a - e/2)
//                                 <= 2 e t - e^2 (1 - t^2) =: y,
//   (tanh is concave on [0, inf): its mean over [m, a] is at most its
//   value at the midpoint (Hermite-Hadamard), which is at most the
//   tangent at a), so sech^2 m <= (1 - t^2) exp(y), and exp(y) <=
//   1 + y + y^2 (1/2 + y) for 0 <= y <= 2^-10 (beyond that, or for an
//   unbounded e, the formula above is used as written).  1 - t^2 is
//   formed in DD from the DD value t (relative error <= 2^-99, as for
//   every DD transcendental) and bounded up (down, in y) by 2^-96
//   absolute and 2^-50 relative; every double operation after it rounds
//   up (factors 1 + 2^-50 over at most 6 roundings, then kUpDD).  The
//   bound is within about e^3 of the one with tanh(m) (tested against
//   MPFR's to dd_bound_rel), and >= the exact-arithmetic one.
//   Overflow is not modelled (no float32 value may exceed 2^127).
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <ostream>

#include "oracle/dd.hpp"
#include "oracle/error_model.hpp"
#include "oracle/real.hpp"

namespace accumcheck {

namespace tracked_detail {

template <class B>
const B& unit() {
  static const B u(error_model::kUnitRoundoff32);  // 2^-24, exact
  return u;
}
template <class B>
const B& one_plus_u() {
  static const B k = B(1) + B(error_model::kUnitRoundoff32);
  return k;
}
template <class B>
const B& eta() {
  static const B k(std::ldexp(1.0, -150));
  return k;
}
template <class B>
B infinity() {
  return std::numeric_limits<B>::infinity();
}
template <class B>
ACCUMCHECK_DD_INLINE bool is_zero(const B& x) {
  return x == 0;
}
// A DD is normalized (|lo| <= ulp(hi)/2: every operation ends in a
// normalization; from a double, an integer or MPFR lo is what is left of
// x once hi is taken): hi == 0 only with lo == 0, one comparison.
ACCUMCHECK_DD_INLINE bool is_zero(const DD& x) { return x.hi == 0; }
// Whether x is a float32 number (finite).
template <class B>
ACCUMCHECK_DD_INLINE bool float_exact(const B& x) {
  const float f = static_cast<float>(x);
  return std::isfinite(f) && B(f) == x;
}
// The exponent of the lowest set bit of a nonzero float32 number.
inline int low_bit(float f) {
  int ex = 0;
  const float m = std::frexp(f, &ex);
  auto M = static_cast<uint32_t>(std::fabs(std::ldexp(m, 24)));
  int tz = 0;
  while ((M & 1u) == 0) M >>= 1, ++tz;
  return ex - 24 + tz;
}
template <class B>
B expm1_of(const B& x) {
  if constexpr (std::floating_point<B>) {
    return std::expm1(x);
  } else if constexpr (std::is_same_v<B, DD>) {
    return expm1(x);  // DD's own, accurate near 0
  } else {
    using std::exp;
    return B(exp(x) - 1);  // >= 50 digits: cancellation is harmless
  }
}
template <class B>
B gamma(int64_t m) {
  const B mu = B(double(m)) * unit<B>();
  if (mu >= 1) return infinity<B>();
  return B(mu / (1 - mu));
}

// The bounds of a + b, a * b and a / b (the formulas of the derivation
// above), evaluated in B as written.
template <class B>
B add_bound(const B& ae, const B& be, const B& rv) {
  using std::abs;
  return (ae + be) * one_plus_u<B>() + unit<B>() * abs(rv);
}
template <class B>
B mul_bound(const B& av, const B& ae, const B& bv, const B& be, const B& rv) {
  using std::abs;
  const B P = abs(av) * be + abs(bv) * ae + ae * be;
  return P * one_plus_u<B>() + unit<B>() * abs(rv) + eta<B>();
}
// The caller has checked be < |bv|.
template <class B>
B div_bound(const B& ae, const B& bv, const B& be, const B& rv) {
  using std::abs;
  const B D = (ae + abs(rv) * be) / (abs(bv) - be);
  return D * one_plus_u<B>() + unit<B>() * abs(rv) + eta<B>();
}

// The same three for DD, in double from the high parts and rounded up:
// a DD x satisfies |x| <= |x.hi| (1 + 2^-53), each formula rounds at most
// 7 times (each <= 2^-53 relative, all terms nonnegative), so the result
// times kUpDD = 1 + 2^-49 (itself rounded once more) is >= the formula in
// exact arithmetic.  The subtraction of div_bound's denominator is done
// on a lower bound of |bv| and an upper bound of be, then rounded down.
inline constexpr double kUpDD = 1 + 0x1p-49;
ACCUMCHECK_DD_INLINE DD add_bound(const DD& ae, const DD& be, const DD& rv) {
  constexpr double u = error_model::kUnitRoundoff32;
  return DD(((ae.hi + be.hi) * (1 + u) + u * std::fabs(rv.hi)) * kUpDD);
}
ACCUMCHECK_DD_INLINE DD mul_bound(const DD& av, const DD& ae, const DD& bv,
                                  const DD& be, const DD& rv) {
  constexpr double u = error_model::kUnitRoundoff32;
  const double P =
      std::fabs(av.hi) * be.hi + std::fabs(bv.hi) * ae.hi + ae.hi * be.hi;
  return DD((P * (1 + u) + u * std::fabs(rv.hi) + 0x1p-150) * kUpDD);
}
ACCUMCHECK_DD_INLINE DD div_bound(const DD& ae, const DD& bv, const DD& be,
                                  const DD& rv) {
  constexpr double u = error_model::kUnitRoundoff32;
  const double den =
      (std::fabs(bv.hi) * (1 - 0x1p-52) - be.hi * (1 + 0x1p-52)) *
      (1 - 0x1p-52);
  if (!(den > 0)) return DD(std::numeric_limits<double>::infinity());
  const double D = (ae.hi + std::fabs(rv.hi) * be.hi) / den;
  return DD((D * (1 + u) + u * std::fabs(rv.hi) + 0x1p-150) * kUpDD);
}

// sqrt's bound S (1 + u) + u sqrt x, S = min(ex / sqrt x, sqrt ex), in
// double and rounded up: ex <= ex.hi (1 + 2^-52) =: eh; sqrt and / round
// once each (<= 2^-53, covered by a factor 1 + 2^-52), sqrt x >= its
// high part (1 - 2^-52); the last formula's roundings are kUpDD's.
ACCUMCHECK_DD_INLINE DD sqrt_bound(const DD& xe, const DD& rv) {
  constexpr double u = error_model::kUnitRoundoff32;
  const double eh = xe.hi * (1 + 0x1p-52);
  double S = std::sqrt(eh) * (1 + 0x1p-52);
  if (rv.hi > 0) {
    const double lin = eh / (rv.hi * (1 - 0x1p-52)) * (1 + 0x1p-52);
    if (lin < S) S = lin;
  }
  return DD((S * (1 + u) + u * std::fabs(rv.hi)) * kUpDD);
}

// exp's bound X + kExpUlp u (exp x + X), X = exp x expm1(ex), for DD
// without a DD expm1 (the value's exp is the only DD transcendental):
// for 0 <= ex <= 2^-10, expm1(ex) = ex (1 + ex/2 + ex^2/6 + ...) <=
// ex (1 + ex (1/2 + ex)) (the tail ex^2/6 (1 + ex/4 + ...) <= ex^2), four
// roundings of nonnegative terms (covered by 1 + 2^-50); exp x <= its
// high part (1 + 2^-52); the last formula's roundings are kUpDD's.
// Returns false (the caller uses the formula as written) for a wider or
// unbounded ex.
ACCUMCHECK_DD_INLINE bool exp_bound(const DD& xe, const DD& rv, DD& out) {
  constexpr double ku = error_model::kExpUlp * error_model::kUnitRoundoff32;
  constexpr double up = 1 + 0x1p-50;
  const double e = xe.hi * (1 + 0x1p-52);
  if (!(e <= 0x1p-10) || !(rv.hi >= 0)) return false;
  const double E = e * (1 + e * (0.5 + e)) * up;
  const double t = rv.hi * (1 + 0x1p-52);
  const double X = t * E * up;
  out = DD((X + ku * (t + X)) * kUpDD);
  return true;
}

// tanh's bound T + kTanhUlp u (|tanh x| + T), T = min(ex sech^2(m), 2),
// m = max(|x| - ex, 0), for DD without a second DD tanh (of m): from the
// value t = |tanh x| already computed (the header comment's "tanh's slope
// bound, for DD" has the reasoning; m is the caller's |x| - ex in DD,
// whose sign is exact).  Returns false where the caller is to use the
// general formula.
ACCUMCHECK_DD_INLINE bool tanh_bound(const DD& xe, const DD& m, const DD& rv,
                                     DD& out) {
  constexpr double ku = error_model::kTanhUlp * error_model::kUnitRoundoff32;
  constexpr double up = 1 + 0x1p-50;
  if (!(xe.hi < std::numeric_limits<double>::infinity())) return false;
  const double t = std::fabs(rv.hi);
  const double tu = t * (1 + 0x1p-51);
  const double exu = xe.hi * (1 + 0x1p-51);
  double S = 1;  // sech^2(0): m <= 0, or too wide an interval
  if (m.hi > 0 && xe.hi > 0) {
    const DD q = DD(1) - rv * rv;  // sech^2 |x| = 1 - tanh^2 |x|
    const double qh = q.hi > 0 ? q.hi : 0.0;
    const double qu = (qh * (1 + 0x1p-52) + 0x1p-96) * up;
    const double ql = qh * (1 - 0x1p-50) - 0x1p-96;
    const double exl = xe.hi * (1 - 0x1p-51);
    const double z = ql > 0 ? exl * exl * ql * (1 - 0x1p-50) : 0.0;
    double y = (2 * exu * tu * up - z) * up;
    if (y < 0) y = 0;
    if (!(y <= 0x1p-10)) return false;
    const double G = (1 + y + y * y * (0.5 + y)) * up;
    S = qu * G * up;
    if (S > 1) S = 1;
  }
  double T = exu * S * up;
  if (T > 2) T = 2;
  out = DD((T + ku * (tu + T)) * kUpDD);
  return true;
}

}  // namespace tracked_detail

template <class B>
struct Tracked {
  B v = B(0);
  B e = B(0);

  Tracked() = default;
  Tracked(const B& value, const B& err) : v(value), e(err) {}
  // Data: float32-exact.
  Tracked(float x) : v(x), e(0) {}
  // Hyperparameters and literals: rounded once by a float32 engine.
  Tracked(double x) : v(x), e(0) {
    using std::abs;
    e = abs(v - B(static_cast<float>(x)));
  }
  template <std::integral I>
  Tracked(I x) : v(x), e(0) {
    using std::abs;
    e = abs(v - B(static_cast<float>(x)));
  }
  // A value the engine holds exactly (e = 0).
  static Tracked exact(const B& x) { return Tracked(x, B(0)); }

  explicit operator double() const { return static_cast<double>(v); }

  ACCUMCHECK_DD_INLINE Tracked& operator+=(const Tracked& o) {
    return *this = *this + o;
  }
  ACCUMCHECK_DD_INLINE Tracked& operator-=(const Tracked& o) {
    return *this = *this - o;
  }
  ACCUMCHECK_DD_INLINE Tracked& operator*=(const Tracked& o) {
    return *this = *this * o;
  }
  ACCUMCHECK_DD_INLINE Tracked& operator/=(const Tracked& o) {
    return *this = *this / o;
  }

  ACCUMCHECK_DD_INLINE friend Tracked operator-(const Tracked& a) {
    return Tracked(B(-a.v), a.e);
  }

  ACCUMCHECK_DD_INLINE friend Tracked operator+(const Tracked& a,
                                                const Tracked& b) {
    using namespace tracked_detail;
    using std::abs;
    Tracked r;
    r.v = a.v + b.v;
    if (is_zero(a.e) && is_zero(b.e) && float_exact(r.v)) return r;
    r.e = add_bound(a.e, b.e, r.v);
    return r;
  }
  ACCUMCHECK_DD_INLINE friend Tracked operator-(const Tracked& a,
                                                const Tracked& b) {
    return a + (-b);
  }
  ACCUMCHECK_DD_INLINE friend Tracked operator*(const Tracked& a,
                                                const Tracked& b) {
    using namespace tracked_detail;
    using std::abs;
    Tracked r;
    r.v = a.v * b.v;
    if (is_zero(a.e) && is_zero(b.e) && float_exact(r.v)) return r;
    // An exact zero times any finite float is an exact zero, whatever the
    // other factor's bound (even an unbounded one: Adam's step at lr = 0
    // times an update whose denominator's bound reaches 0).  Overflow is
    // outside the model, so the other float factor is finite.
    if ((is_zero(a.v) && is_zero(a.e)) || (is_zero(b.v) && is_zero(b.e)))
      return Tracked(B(0), B(0));
    r.e = mul_bound(a.v, a.e, b.v, b.e, r.v);
    return r;
  }
  ACCUMCHECK_DD_INLINE friend Tracked operator/(const Tracked& a,
                                                const Tracked& b) {
    using namespace tracked_detail;
    using std::abs;
    Tracked r;
    r.v = a.v / b.v;
    if (is_zero(a.e) && is_zero(b.e) && float_exact(r.v)) return r;
    const B ab = abs(b.v);
    if (b.e >= ab) {
      r.e = infinity<B>();
      return r;
    }
    r.e = div_bound(a.e, b.v, b.e, r.v);
    return r;
  }

  friend bool operator<(const Tracked& a, const Tracked& b) {
    return a.v < b.v;
  }
  friend bool operator>(const Tracked& a, const Tracked& b) {
    return a.v > b.v;
  }
  friend bool operator<=(const Tracked& a, const Tracked& b) {
    return a.v <= b.v;
  }
  friend bool operator>=(const Tracked& a, const Tracked& b) {
    return a.v >= b.v;
  }
  friend bool operator==(const Tracked& a, const Tracked& b) {
    return a.v == b.v;
  }

  ACCUMCHECK_DD_INLINE friend Tracked abs(const Tracked& a) {
    using std::abs;
    return Tracked(B(abs(a.v)), a.e);
  }
  ACCUMCHECK_DD_INLINE friend Tracked sqrt(const Tracked& x) {
    using namespace tracked_detail;
    using std::sqrt;
    Tracked r;
    r.v = sqrt(x.v);
    if (is_zero(x.e) && float_exact(r.v)) return r;
    if constexpr (std::is_same_v<B, DD>) {
      r.e = sqrt_bound(x.e, r.v);
      return r;
    }
    B S(0);
    if (!is_zero(x.e)) {
      S = sqrt(x.e);
      if (r.v > 0) {
        const B lin = x.e / r.v;
        if (lin < S) S = lin;
      }
    }
    r.e = S * one_plus_u<B>() + unit<B>() * r.v;
    return r;
  }
  friend Tracked exp(const Tracked& x) {
    using std::exp;
    return exp_of(x, exp(x.v));
  }
  // exp(x) given the value exp(x.v) (dd_lanes::exp_forward computes the
  // values four at a time): its bound.
  static Tracked exp_of(const Tracked& x, const B& value) {
    using namespace tracked_detail;
    Tracked r;
    r.v = value;
    if constexpr (std::is_same_v<B, DD>) {
      if (exp_bound(x.e, r.v, r.e)) return r;
    }
    const B X = r.v * expm1_of(x.e);
    r.e = X + B(error_model::kExpUlp) * unit<B>() * (r.v + X);
    return r;
  }
  friend Tracked log(const Tracked& x) {
    using namespace tracked_detail;
    using std::abs;
    using std::log;
    Tracked r;
    r.v = log(x.v);
    if (x.e >= x.v) {
      r.e = infinity<B>();
      return r;
    }
    const B L = x.e / (x.v - x.e);
    B mag = abs(r.v) + L;
    if (mag < 1) mag = 1;
    r.e = L + B(error_model::kLogUlp) * unit<B>() * mag;
    return r;
  }
  friend Tracked tanh(const Tracked& x) {
    using std::tanh;
    return tanh_of(x, tanh(x.v));
  }
  // tanh(x) given the value tanh(x.v) (dd_lanes::tanh_forward computes
  // the values four at a time): its bound.
  static Tracked tanh_of(const Tracked& x, const B& value) {
    using namespace tracked_detail;
    using std::abs;
    using std::tanh;
    Tracked r;
    r.v = value;
    B m = abs(x.v) - x.e;
    if constexpr (std::is_same_v<B, DD>) {
      if (tanh_bound(x.e, m, r.v, r.e)) return r;
    }
    if (m < 0) m = 0;
    const B th = tanh(m);
    B T = x.e * (1 - th * th);
    if (T > 2) T = 2;
    r.e = T + B(error_model::kTanhUlp) * unit<B>() * (abs(r.v) + T);
    return r;
  }
  friend Tracked erf(const Tracked& x) {
    using namespace tracked_detail;
    using std::abs;
    using std::erf;
    using std::exp;
    Tracked r;
    r.v = erf(x.v);
    B m = abs(x.v) - x.e;
    if (m < 0) m = 0;
    // 2/sqrt(pi) = 1.12837916709551257..., rounded up.
    B R = x.e * B(1.1283791670955131) * exp(B(-(m * m)));
    if (R > 2) R = 2;
    r.e = R + B(error_model::kErfUlp) * unit<B>() * (abs(r.v) + R);
    return r;
  }

  friend std::ostream& operator<<(std::ostream& os, const Tracked& x) {
    return os << x.v << " +- " << x.e;
  }
};

// x > 0 ? a : b, widened where the engine may decide the other way.
template <class B>
Tracked<B> branch_positive(const Tracked<B>& x, const Tracked<B>& a,
                           const Tracked<B>& b) {
  using std::abs;
  const bool pos = x.v > 0;
  Tracked<B> r = pos ? a : b;
  if (tracked_detail::is_zero(x.e) || abs(x.v) > x.e) return r;
  const Tracked<B>& other = pos ? b : a;
  const B alt = abs(r.v - other.v) + other.e;
  if (r.e < alt) r.e = alt;
  return r;
}

template <class B>
void dot_into(Tracked<B>& out, const Tracked<B>* init, int64_t n,
              const Tracked<B>* a, int64_t sa, const Tracked<B>* b,
              int64_t sb) {
  using namespace tracked_detail;
  using std::abs;
  B v = init ? init->v : B(0);
  B P = init ? init->e : B(0);
  B M = init ? B(abs(init->v)) : B(0);
  bool exact = !init || is_zero(init->e);
  B t, aa, ab;
  for (int64_t k = 0; k < n; ++k) {
    const Tracked<B>& x = a[k * sa];
    const Tracked<B>& y = b[k * sb];
    t = x.v * y.v;
    v += t;
    M += abs(t);
    if (!is_zero(x.e) || !is_zero(y.e)) {
      exact = false;
      aa = abs(x.v);
      ab = abs(y.v);
      P += aa * y.e + ab * x.e + x.e * y.e;
    }
  }
  if (exact) {
    // Every partial sum exact in any order?  (See the derivation above.)
    int low = std::numeric_limits<int>::max();
    auto note = [&](const B& p) {
      if (is_zero(p)) return true;
      if (!float_exact(p)) return false;
      low = std::min(low, low_bit(static_cast<float>(p)));
      return true;
    };
    if (init) exact = note(init->v);
    for (int64_t k = 0; k < n && exact; ++k)
      exact = note(B(a[k * sa].v * b[k * sb].v));
    if (exact && (low == std::numeric_limits<int>::max() ||
                  M < B(std::ldexp(1.0, low + 24)))) {
      out.v = v;
      out.e = 0;
      return;
    }
  }
  const int64_t m = n + (init ? 1 : 0);
  const B g = gamma<B>(m);
  out.v = v;
  out.e = P * (1 + g) + g * M + B(double(n)) * eta<B>();
}

template <class B>
void sum_into(Tracked<B>& out, const Tracked<B>* init, int64_t n,
              const Tracked<B>* a, int64_t sa) {
  using namespace tracked_detail;
  using std::abs;
  B v = init ? init->v : B(0);
  B P = init ? init->e : B(0);
  B M = init ? B(abs(init->v)) : B(0);
  bool exact = !init || is_zero(init->e);
  for (int64_t k = 0; k < n; ++k) {
    const Tracked<B>& x = a[k * sa];
    v += x.v;
    M += abs(x.v);
    if (!is_zero(x.e)) {
      exact = false;
      P += x.e;
    }
  }
  if (exact) {
    int low = std::numeric_limits<int>::max();
    auto note = [&](const B& p) {
      if (is_zero(p)) return true;
      low = std::min(low, low_bit(static_cast<float>(p)));
      return true;  // e = 0 values are float32 numbers
    };
    if (init) note(init->v);
    for (int64_t k = 0; k < n; ++k) note(a[k * sa].v);
    if (low == std::numeric_limits<int>::max() ||
        M < B(std::ldexp(1.0, low + 24))) {
      out.v = v;
      out.e = 0;
      return;
    }
  }
  const int64_t m = n + (init ? 1 : 0);
  const B g = gamma<B>(m > 0 ? m - 1 : 0);
  out.v = v;
  out.e = P * (1 + g) + g * M;
}

template <class B>
void max_into(Tracked<B>& out, int64_t n, const Tracked<B>* a, int64_t sa) {
  B v = a[0].v, e = a[0].e;
  for (int64_t k = 1; k < n; ++k) {
    if (v < a[k * sa].v) v = a[k * sa].v;
    if (e < a[k * sa].e) e = a[k * sa].e;
  }
  out.v = v;
  out.e = e;
}

// The host scalars of a DD oracle are computed in MPFR (a few per step)
// and rounded to DD.
template <>
struct Num<DD> {
  using Host = BoundReal;
  static DD from_host(const Host& h) { return DD(h); }
  static DD from_constant(const Host& h) { return DD(h); }
};

template <class B>
struct Num<Tracked<B>> {
  using Host = typename Num<B>::Host;
  static Tracked<B> from_host(const Host& h) {
    using std::abs;
    const B x(h);
    return Tracked<B>(x, B(abs(x) * B(error_model::kUnitRoundoff32)));
  }
  static Tracked<B> from_constant(const Host& h) {
    using std::abs;
    const B x(h);
    return Tracked<B>(x, B(abs(x - B(static_cast<float>(x)))));
  }
};

// The loss weight (1/den, or MSE's 2/(d*den)) as a trainer may form it:
// PyTorch's mean backward divides by numel, `loss / K` multiplies by 1/K,
// MSE multiplies by 2: up to three correctly rounded factors, relative
// error (1+u)^3 - 1 < 3.0000001 u.  The bound allows for any such order
// (a float32 engine forming it in one division lies inside it too), so a
// correct trainer is not failed for where it rounds its loss scale.  A
// weight that is exact (bound 0) is a power of two with power-of-two
// factors, exact in every order, and stays exact.
// A DDP rank's weight R/N_w (num = R, sim/engine.hpp LossWeight) is formed
// as (1/N_w) * R: one factor more, four roundings, (1+u)^4 - 1 <
// 4.0000001 u, unless R is a power of two (then that factor is exact).
template <class T>
T trainer_loss_weight(const T& w, int64_t = 1) {
  return w;
}
template <class B>
Tracked<B> trainer_loss_weight(const Tracked<B>& w, int64_t num = 1) {
  using std::abs;
  Tracked<B> r = w;
  // An exact weight (d, b and K powers of two) is exact in every order.
  if (r.e == B(0)) return r;
  const bool pow2 = num > 0 && (num & (num - 1)) == 0;
  const B roundings =
      B(pow2 ? 3.0000001 : 4.0000001) * tracked_detail::unit<B>() * abs(w.v);
  if (r.e < roundings) r.e = roundings;
  return r;
}

}  // namespace accumcheck

// The reductions of a DD oracle, specialized (dot_into, sum_into for
// Tracked<DD>): their own file, part of this header.
#include "oracle/tracked_dd_reductions.hpp"
