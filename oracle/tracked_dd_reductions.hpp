// dot_into and sum_into for Tracked<DD>: the fast DD reductions of the
// derivation in oracle/tracked.hpp ("B = DD": compensated summation of the
// values, the nonnegative sums P and M in double from the high parts,
// inflated to an upper bound).  Included at the end of oracle/tracked.hpp,
// so every user of Tracked<DD> has these overloads, never the generic
// reductions by accident.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "oracle/tracked.hpp"

namespace accumcheck {

namespace tracked_detail {

// The inflation that makes a double sum of m nonnegative terms, each
// formed from DD high parts with a few roundings, an upper bound.
inline double sum_inflation(int64_t m) {
  return 1.0 + double(m + 16) * 0x1p-52;
}

// Dot2's own error (value): 2^-53 |result| is absorbed into the final DD
// normalization; gamma_n(2^-53)^2 M plus the dropped lo*lo and rounded
// cross terms (3 * 2^-106 per product) is added to e: (n + 4)^2 2^-104 M
// (ReductionConstants::dot2, below).

// e = P (1 + gamma_g) + gamma_g M (+ n eta for products) + Dot2's own
// error, all in double and rounded up: P and M are sums of n nonnegative
// doubles (inflated by sum_inflation), the initial value's bound and
// magnitude are added (as upper bounds: hi (1 + 2^-52)), gamma_g =
// g u / (1 - g u) has g u and 1 - g u exact in double (g < 2^29), and the
// final formula's few roundings are covered by kUpDD like the +, *, /
// bounds.
// The constants of that formula for one g and n (the same doubles whether
// formed per reduction or once for a batch of reductions of one shape).
struct ReductionConstants {
  bool unbounded = false;  // g u >= 1
  double gam = 0, one_plus_gam = 1, F = 1, dot2 = 0, etas = 0;
  ReductionConstants(int64_t g, int64_t n, bool products) {
    constexpr double u = error_model::kUnitRoundoff32;
    const double mu = double(g) * u;
    if (mu >= 1) {
      unbounded = true;
      return;
    }
    gam = mu / (1 - mu) * (1 + 0x1p-52);
    one_plus_gam = 1 + gam;
    F = sum_inflation(n);
    const double nn = double(n) + 4;
    dot2 = (nn * nn) * 0x1p-104;  // dot2_error's factor
    etas = products ? double(n) * 0x1p-150 : 0.0;
  }
};

ACCUMCHECK_DD_INLINE double dd_reduction_bound(const ReductionConstants& k,
                                               double P, double M,
                                               const DD* init_v,
                                               double init_e) {
  if (k.unbounded) return std::numeric_limits<double>::infinity();
  double Pu = P * k.F, Mu = M * k.F;
  const double vr = k.dot2 * Mu;
  if (init_v) {
    Pu += init_e * (1 + 0x1p-52);
    Mu += std::fabs(init_v->hi) * (1 + 0x1p-52);
  }
  const double e = Pu * k.one_plus_gam + k.gam * Mu + k.etas + vr;
  return e * kUpDD;
}

inline double dd_reduction_bound(int64_t g, int64_t n, double P, double M,
                                 const DD* init_v, double init_e,
                                 bool products) {
  return dd_reduction_bound(ReductionConstants(g, n, products), P, M, init_v,
                            init_e);
}

}  // namespace tracked_detail

namespace tracked_detail {
// dot_into's exact case for DD (every input exact, bound 0): whether every
// partial sum is exact in any order (see the derivation above).  M is the
// double sum of the products' high parts' magnitudes, in term order.
// With exact float32 inputs every product is exact in double.
inline bool dot_exact_sum(const Tracked<DD>* init, int64_t n,
                          const Tracked<DD>* a, int64_t sa,
                          const Tracked<DD>* b, int64_t sb, double M) {
  bool exact = true;
  int low = std::numeric_limits<int>::max();
  auto note = [&](const DD& p) {
    if (p.hi == 0) return true;
    if (!float_exact(p)) return false;
    low = std::min(low, low_bit(static_cast<float>(p)));
    return true;
  };
  double Mx = M;
  if (init) {
    exact = note(init->v);
    Mx += std::fabs(init->v.hi);
  }
  for (int64_t k = 0; k < n && exact; ++k)
    exact = note(a[k * sa].v * b[k * sb].v);
  return exact && (low == std::numeric_limits<int>::max() ||
                   Mx < std::ldexp(1.0, low + 24));
}

// dot_into for DD with the bound's constants given (`k`: g = n + 1 with
// an initial value, else n; products).
ACCUMCHECK_DD_INLINE void dot_into_dd(Tracked<DD>& out, const Tracked<DD>* init,
                                      int64_t n, const Tracked<DD>* a,
                                      int64_t sa, const Tracked<DD>* b,
                                      int64_t sb, const ReductionConstants& k) {
  double s = 0, c = 0, M = 0, P = 0;
  bool exact = !init || init->e.hi == 0;
  bool inexact_inputs = false;
  for (int64_t k = 0; k < n; ++k) {
    const Tracked<DD>& x = a[k * sa];
    const Tracked<DD>& y = b[k * sb];
    const double ph = x.v.hi * y.v.hi;
    const double pl =
        std::fma(x.v.hi, y.v.hi, -ph) + (x.v.hi * y.v.lo + x.v.lo * y.v.hi);
    const double t = s + ph;
    const double bb = t - s;
    c += ((s - (t - bb)) + (ph - bb)) + pl;
    s = t;
    M += std::fabs(ph);
    if (x.e.hi != 0 || y.e.hi != 0) {
      inexact_inputs = true;
      P += std::fabs(x.v.hi) * y.e.hi + std::fabs(y.v.hi) * x.e.hi +
           x.e.hi * y.e.hi;
    }
  }
  DD v = DD::quick_two_sum(s, c);
  if (!std::isfinite(s)) v = DD(s);
  exact = exact && !inexact_inputs;
  if (exact && dot_exact_sum(init, n, a, sa, b, sb, M)) {
    out.v = init ? v + init->v : v;
    out.e = 0;
    return;
  }
  out.e = DD(dd_reduction_bound(k, P, M, init ? &init->v : nullptr,
                                init ? init->e.hi : 0.0));
  out.v = init ? v + init->v : v;
}
}  // namespace tracked_detail

inline void dot_into(Tracked<DD>& out, const Tracked<DD>* init, int64_t n,
                     const Tracked<DD>* a, int64_t sa, const Tracked<DD>* b,
                     int64_t sb) {
  using namespace tracked_detail;
  dot_into_dd(out, init, n, a, sa, b, sb,
              ReductionConstants(n + (init ? 1 : 0), n, true));
}

inline void sum_into(Tracked<DD>& out, const Tracked<DD>* init, int64_t n,
                     const Tracked<DD>* a, int64_t sa) {
  using namespace tracked_detail;
  double s = 0, c = 0, M = 0, P = 0;
  bool exact = !init || init->e.hi == 0;
  for (int64_t k = 0; k < n; ++k) {
    const Tracked<DD>& x = a[k * sa];
    const double t = s + x.v.hi;
    const double bb = t - s;
    c += ((s - (t - bb)) + (x.v.hi - bb)) + x.v.lo;
    s = t;
    M += std::fabs(x.v.hi);
    if (x.e.hi != 0) {
      exact = false;
      P += x.e.hi;
    }
  }
  DD v = DD::quick_two_sum(s, c);
  if (!std::isfinite(s)) v = DD(s);
  if (exact) {
    int low = std::numeric_limits<int>::max();
    auto note = [&](const DD& p) {
      if (p.hi != 0) low = std::min(low, low_bit(static_cast<float>(p)));
    };
    double Mx = M;
    if (init) {
      note(init->v);
      Mx += std::fabs(init->v.hi);
    }
    for (int64_t k = 0; k < n; ++k) note(a[k * sa].v);
    if (low == std::numeric_limits<int>::max() ||
        Mx < std::ldexp(1.0, low + 24)) {
      out.v = init ? v + init->v : v;
      out.e = 0;
      return;
    }
  }
  const int64_t m = n + (init ? 1 : 0);
  out.e = DD(dd_reduction_bound(m > 0 ? m - 1 : 0, n, P, M,
                                init ? &init->v : nullptr,
                                init ? init->e.hi : 0.0, false));
  out.v = init ? v + init->v : v;
}

}  // namespace accumcheck
