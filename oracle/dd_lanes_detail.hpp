// The lanes of oracle/dd_lanes.hpp's kernels: four doubles (one per
// lane of an AVX vector) and the DD and Tracked<DD> operations on them,
// each written out as the scalar operation's common path (oracle/dd.hpp,
// oracle/tracked.hpp, oracle/tracked_dd_reductions.hpp) in its order, so
// that a lane's doubles are the scalar code's; a lane that would leave
// that path is marked for the scalar code.  For oracle/dd_lanes*.cpp only.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "oracle/dd_lanes.hpp"
#include "oracle/layers.hpp"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace accumcheck::dd_lanes {

namespace lanes_detail {

using tracked_detail::dot_exact_sum;
using tracked_detail::dot_into_dd;
using tracked_detail::kUpDD;
using tracked_detail::ReductionConstants;

// Four doubles (one per lane) and a lane mask (all ones or zero).
using d4 = double __attribute__((vector_size(32)));
using i4 = long long __attribute__((vector_size(32)));

ACCUMCHECK_DD_INLINE d4 splat(double x) { return d4{x, x, x, x}; }
ACCUMCHECK_DD_INLINE d4 fabs4(d4 x) {
  constexpr long long kAbs = 0x7fffffffffffffffLL;
  return reinterpret_cast<d4>(reinterpret_cast<i4>(x) &
                              i4{kAbs, kAbs, kAbs, kAbs});
}
ACCUMCHECK_DD_INLINE d4 fma4(d4 a, d4 b, d4 c) {
#if defined(__FMA__)
  return _mm256_fmadd_pd(a, b, c);
#else
  return d4{std::fma(a[0], b[0], c[0]), std::fma(a[1], b[1], c[1]),
            std::fma(a[2], b[2], c[2]), std::fma(a[3], b[3], c[3])};
#endif
}
// Bit l set where lane l of m is set.
ACCUMCHECK_DD_INLINE int bits(i4 m) {
#if defined(__AVX__)
  return _mm256_movemask_pd(reinterpret_cast<__m256d>(m));
#else
  return (m[0] ? 1 : 0) | (m[1] ? 2 : 0) | (m[2] ? 4 : 0) | (m[3] ? 8 : 0);
#endif
}
ACCUMCHECK_DD_INLINE d4 sqrt4(d4 x) {
#if defined(__AVX__)
  return _mm256_sqrt_pd(x);
#else
  return d4{std::sqrt(x[0]), std::sqrt(x[1]), std::sqrt(x[2]), std::sqrt(x[3])};
#endif
}
ACCUMCHECK_DD_INLINE i4 finite4(d4 x) {
  return fabs4(x) < splat(std::numeric_limits<double>::infinity());
}
// tracked_detail::float_exact for a DD (hi, lo): lo = 0 and hi a finite
// float32 number (DD's conversion to float returns float(hi) when lo = 0,
// and DD equality compares both parts).
ACCUMCHECK_DD_INLINE i4 float_exact4(d4 h, d4 l) {
  using f4 = float __attribute__((vector_size(16)));
  const d4 back = __builtin_convertvector(__builtin_convertvector(h, f4), d4);
  return (back == h) & (l == d4{}) & finite4(back);
}
ACCUMCHECK_DD_INLINE d4 select(i4 m, d4 x) {
  return reinterpret_cast<d4>(m & reinterpret_cast<i4>(x));
}

// Four consecutive doubles (any alignment), and back.
ACCUMCHECK_DD_INLINE d4 load4(const double* p) {
  d4 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
ACCUMCHECK_DD_INLINE void store4(double* p, d4 x) {
  std::memcpy(p, &x, sizeof x);
}

// Four consecutive Tracked<DD> as structure of arrays (v.hi, v.lo, e.hi),
// and back (e.lo = 0, as every bound is a double).
static_assert(sizeof(TD) == 4 * sizeof(double));
ACCUMCHECK_DD_INLINE void load4(const TD* p, d4& h, d4& l, d4& e) {
#if defined(__AVX__)
  const double* q = &p[0].v.hi;
  const __m256d r0 = _mm256_loadu_pd(q), r1 = _mm256_loadu_pd(q + 4),
                r2 = _mm256_loadu_pd(q + 8), r3 = _mm256_loadu_pd(q + 12);
  const __m256d t0 = _mm256_unpacklo_pd(r0, r1);  // h0 h1 e0 e1
  const __m256d t1 = _mm256_unpackhi_pd(r0, r1);  // l0 l1 .. ..
  const __m256d t2 = _mm256_unpacklo_pd(r2, r3);  // h2 h3 e2 e3
  const __m256d t3 = _mm256_unpackhi_pd(r2, r3);  // l2 l3 .. ..
  h = _mm256_permute2f128_pd(t0, t2, 0x20);
  e = _mm256_permute2f128_pd(t0, t2, 0x31);
  l = _mm256_permute2f128_pd(t1, t3, 0x20);
#else
  h = d4{p[0].v.hi, p[1].v.hi, p[2].v.hi, p[3].v.hi};
  l = d4{p[0].v.lo, p[1].v.lo, p[2].v.lo, p[3].v.lo};
  e = d4{p[0].e.hi, p[1].e.hi, p[2].e.hi, p[3].e.hi};
#endif
}
ACCUMCHECK_DD_INLINE void store4(TD* p, d4 h, d4 l, d4 e) {
#if defined(__AVX__)
  const __m256d z = _mm256_setzero_pd();
  const __m256d t0 = _mm256_unpacklo_pd(h, l);  // h0 l0 h2 l2
  const __m256d t1 = _mm256_unpackhi_pd(h, l);  // h1 l1 h3 l3
  const __m256d t2 = _mm256_unpacklo_pd(e, z);  // e0 0 e2 0
  const __m256d t3 = _mm256_unpackhi_pd(e, z);  // e1 0 e3 0
  double* q = &p[0].v.hi;
  _mm256_storeu_pd(q, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(q + 4, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(q + 8, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(q + 12, _mm256_permute2f128_pd(t1, t3, 0x31));
#else
  for (int k = 0; k < 4; ++k) {
    p[k].v = DD::raw(h[k], l[k]);
    p[k].e = DD(e[k]);
  }
#endif
}

// DD's operator+ (value): hi and lo.
ACCUMCHECK_DD_INLINE void dd_add(d4 ah, d4 al, d4 bh, d4 bl, d4& h, d4& l,
                                 i4& bad) {
  const d4 sh = ah + bh;
  const d4 bb = sh - ah;
  d4 sl = (ah - (sh - bb)) + (bh - bb);
  bad |= ~finite4(sh);
  const d4 th = al + bl;
  const d4 bt = th - al;
  const d4 tl = (al - (th - bt)) + (bl - bt);
  sl += th;
  const d4 h2 = sh + sl;
  d4 l2 = sl - (h2 - sh);
  l2 += tl;
  h = h2 + l2;
  l = l2 - (h - h2);
}

// Four Dot2 reductions (dot_into_dd's loop), one term x y at a time with
// x the same in every lane.
struct Acc {
  d4 s{}, c{}, M{}, P{};
  i4 inexact{};
};
ACCUMCHECK_DD_INLINE void add_term(Acc& a, const TD& x, d4 yh, d4 yl, d4 ye) {
  const d4 xh = splat(x.v.hi), xl = splat(x.v.lo), xe = splat(x.e.hi);
  const d4 ph = xh * yh;
  const d4 pl = fma4(xh, yh, -ph) + (xh * yl + xl * yh);
  const d4 t = a.s + ph;
  const d4 bb = t - a.s;
  a.c += ((a.s - (t - bb)) + (ph - bb)) + pl;
  a.s = t;
  a.M += fabs4(ph);
  const d4 zero{};
  const i4 m = (xe != zero) | (ye != zero);
  a.inexact |= m;
  a.P += select(m, fabs4(xh) * ye + fabs4(yh) * xe + xe * ye);
}

// dot_into_dd's ending with an initial value (ih, il, ie): the value
// v + init and the bound.  `bad`: lanes where the scalar code leaves its
// common path on a non-finite value (computed again by it); `exact`:
// lanes whose inputs were all exact (the exact-sum test decides).
struct Fin {
  d4 vh, vl, e;
  int bad, exact;
};
ACCUMCHECK_DD_INLINE Fin finish(const Acc& a, const ReductionConstants& k,
                                d4 ih, d4 il, d4 ie) {
  Fin f;
  // v = quick_two_sum(s, c)
  const d4 vh = a.s + a.c;
  const d4 vl = a.c - (vh - a.s);
  // v + init (DD's operator+; `sum_bad`: its leading sum not finite)
  i4 sum_bad{};
  dd_add(vh, vl, ih, il, f.vh, f.vl, sum_bad);
  // dd_reduction_bound
  d4 Pu = a.P * splat(k.F), Mu = a.M * splat(k.F);
  const d4 vr = splat(k.dot2) * Mu;
  Pu += ie * splat(1 + 0x1p-52);
  Mu += fabs4(ih) * splat(1 + 0x1p-52);
  const d4 e =
      Pu * splat(k.one_plus_gam) + splat(k.gam) * Mu + splat(k.etas) + vr;
  f.e = e * splat(kUpDD);
  f.bad = (bits(sum_bad) | ~bits(finite4(a.s) & finite4(f.vh) & finite4(f.e))) &
          0xf;
  f.exact = bits((ie == d4{}) & ~a.inexact);
  return f;
}

// Tracked<DD> operations on four lanes (the value's hi, lo and the bound's
// hi), each the scalar operation's common path (oracle/dd.hpp's DD
// operators, oracle/tracked.hpp's Tracked ones with the DD bounds) written
// out operation for operation; a lane where the scalar one would leave it
// is marked in `bad`.
struct T4 {
  d4 h, l, e;
};
ACCUMCHECK_DD_INLINE T4 splat(const TD& x) {
  return {splat(x.v.hi), splat(x.v.lo), splat(x.e.hi)};
}
// DD's operator*.
ACCUMCHECK_DD_INLINE void dd_mul(d4 ah, d4 al, d4 bh, d4 bl, d4& h, d4& l,
                                 i4& bad) {
  const d4 ph = ah * bh;
  d4 pl = fma4(ah, bh, -ph);
  bad |= ~finite4(ph);
  pl += ah * bl + al * bh;
  h = ph + pl;
  l = pl - (h - ph);
}
constexpr double kU = error_model::kUnitRoundoff32;

ACCUMCHECK_DD_INLINE T4 tmul(const T4& a, const T4& b, i4& bad) {
  T4 r;
  dd_mul(a.h, a.l, b.h, b.l, r.h, r.l, bad);
  const d4 zero{};
  const i4 az = a.e == zero, bz = b.e == zero;
  // The exact case (bound 0), else an exact zero factor: (0, 0).
  const i4 exact = az & bz & float_exact4(r.h, r.l);
  const i4 keep = exact | ~((az & (a.h == zero)) | (bz & (b.h == zero)));
  const d4 P = fabs4(a.h) * b.e + fabs4(b.h) * a.e + a.e * b.e;
  const d4 e = (P * splat(1 + kU) + splat(kU) * fabs4(r.h) + splat(0x1p-150)) *
               splat(kUpDD);
  r.h = select(keep, r.h);
  r.l = select(keep, r.l);
  r.e = select(keep & ~exact, e);
  return r;
}
ACCUMCHECK_DD_INLINE T4 tadd(const T4& a, const T4& b, i4& bad) {
  T4 r;
  dd_add(a.h, a.l, b.h, b.l, r.h, r.l, bad);
  const d4 zero{};
  const i4 exact = (a.e == zero) & (b.e == zero) & float_exact4(r.h, r.l);
  r.e = select(~exact, ((a.e + b.e) * splat(1 + kU) + splat(kU) * fabs4(r.h)) *
                           splat(kUpDD));
  return r;
}
ACCUMCHECK_DD_INLINE T4 tsub(const T4& a, const T4& b, i4& bad) {
  return tadd(a, T4{-b.h, -b.l, b.e}, bad);
}
ACCUMCHECK_DD_INLINE T4 tsqrt(const T4& x, i4& bad) {
  const d4 zero{};
  bad |= ~(x.h > zero) | ~finite4(x.h);
  // DD's sqrt
  const d4 y = splat(1.0) / sqrt4(x.h);
  const d4 ax = x.h * y;
  const d4 sqh = ax * ax;
  const d4 sql = fma4(ax, ax, -sqh);
  d4 dh, dl;
  dd_add(x.h, x.l, -sqh, -sql, dh, dl, bad);
  const d4 b = dh * (y * splat(0.5));
  T4 r;
  r.h = ax + b;
  const d4 bb = r.h - ax;
  r.l = (ax - (r.h - bb)) + (b - bb);
  // sqrt_bound
  const d4 eh = x.e * splat(1 + 0x1p-52);
  d4 S = sqrt4(eh) * splat(1 + 0x1p-52);
  const d4 lin = eh / (r.h * splat(1 - 0x1p-52)) * splat(1 + 0x1p-52);
  const i4 take = (r.h > zero) & (lin < S);
  S = reinterpret_cast<d4>((take & reinterpret_cast<i4>(lin)) |
                           (~take & reinterpret_cast<i4>(S)));
  const i4 exact = (x.e == zero) & float_exact4(r.h, r.l);
  r.e = select(~exact,
               (S * splat(1 + kU) + splat(kU) * fabs4(r.h)) * splat(kUpDD));
  return r;
}
// a.v - DD(q) * b.v (DD's operator/'s step).
ACCUMCHECK_DD_INLINE void div_rest(d4 ah, d4 al, d4 q, d4 bh, d4 bl, d4& h,
                                   d4& l, i4& bad) {
  d4 ph, pl;
  dd_mul(q, d4{}, bh, bl, ph, pl, bad);
  dd_add(ah, al, -ph, -pl, h, l, bad);
}
// DD's operator/.
ACCUMCHECK_DD_INLINE void dd_div(d4 ah, d4 al, d4 bh, d4 bl, d4& h, d4& l,
                                 i4& bad) {
  const d4 zero{};
  const d4 q1 = ah / bh;
  bad |= ~finite4(q1) | ~finite4(bh);
  d4 rh, rl;
  div_rest(ah, al, q1, bh, bl, rh, rl, bad);
  const d4 q2 = rh / bh;
  div_rest(rh, rl, q2, bh, bl, rh, rl, bad);
  const d4 q3 = rh / bh;
  const d4 sh = q1 + q2;
  const d4 sl = q2 - (sh - q1);
  dd_add(sh, sl, q3, zero, h, l, bad);
}
ACCUMCHECK_DD_INLINE T4 tdiv(const T4& a, const T4& b, i4& bad) {
  const d4 zero{};
  T4 r;
  dd_div(a.h, a.l, b.h, b.l, r.h, r.l, bad);
  // div_bound
  const d4 den = (fabs4(b.h) * splat(1 - 0x1p-52) - b.e * splat(1 + 0x1p-52)) *
                 splat(1 - 0x1p-52);
  const i4 exact = (a.e == zero) & (b.e == zero) & float_exact4(r.h, r.l);
  // Not exact: an unbounded quotient (the divisor's interval reaches 0).
  bad |= ~exact & ((b.e >= fabs4(b.h)) | ~(den > zero));
  const d4 D = (a.e + fabs4(r.h) * b.e) / den;
  r.e = select(~exact,
               (D * splat(1 + kU) + splat(kU) * fabs4(r.h) + splat(0x1p-150)) *
                   splat(kUpDD));
  return r;
}

// dot_into_dd's ending without an initial value.
ACCUMCHECK_DD_INLINE Fin finish(const Acc& a, const ReductionConstants& k) {
  Fin f;
  f.vh = a.s + a.c;
  f.vl = a.c - (f.vh - a.s);
  const d4 Pu = a.P * splat(k.F), Mu = a.M * splat(k.F);
  const d4 vr = splat(k.dot2) * Mu;
  const d4 e =
      Pu * splat(k.one_plus_gam) + splat(k.gam) * Mu + splat(k.etas) + vr;
  f.e = e * splat(kUpDD);
  f.bad = ~bits(finite4(a.s) & finite4(f.vh) & finite4(f.e)) & 0xf;
  f.exact = bits(~a.inexact);
  return f;
}

// Scratch of structure-of-arrays copies, per thread.
std::vector<double>& scratch(size_t n) {
  thread_local std::vector<double> s;
  if (s.size() < n) s.resize(n);
  return s;
}

}  // namespace lanes_detail

}  // namespace accumcheck::dd_lanes
