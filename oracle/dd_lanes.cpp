// oracle/dd_lanes.hpp: Tracked<DD> reductions four outputs at a time, bit
// for bit tracked_detail::dot_into_dd (oracle/tracked_dd_reductions.hpp).
#include "oracle/dd_lanes.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

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
  // v + init (DD's operator+)
  const d4 sh = vh + ih;
  const d4 bb = sh - vh;
  d4 sl = (vh - (sh - bb)) + (ih - bb);
  const d4 th = vl + il;
  const d4 bt = th - vl;
  const d4 tl = (vl - (th - bt)) + (il - bt);
  sl += th;
  const d4 h2 = sh + sl;
  d4 l2 = sl - (h2 - sh);
  l2 += tl;
  f.vh = h2 + l2;
  f.vl = l2 - (f.vh - h2);
  // dd_reduction_bound
  d4 Pu = a.P * splat(k.F), Mu = a.M * splat(k.F);
  const d4 vr = splat(k.dot2) * Mu;
  Pu += ie * splat(1 + 0x1p-52);
  Mu += fabs4(ih) * splat(1 + 0x1p-52);
  const d4 e =
      Pu * splat(k.one_plus_gam) + splat(k.gam) * Mu + splat(k.etas) + vr;
  f.e = e * splat(kUpDD);
  f.bad =
      ~bits(finite4(a.s) & finite4(sh) & finite4(f.vh) & finite4(f.e)) & 0xf;
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

void linear_forward(TD* out, const TD* inp, const TD* W, const TD* bias,
                    int64_t B, int64_t in, int64_t out_dim) {
  using namespace lanes_detail;
  const ReductionConstants k(in + 1, in, true);
  int64_t b0 = 0;
  if (!k.unbounded && B >= 4) {
    // ys[3 i + {0, 1, 2}]: inp[b0 + lane, i]'s v.hi, v.lo, e.hi.
    std::vector<double>& buf = scratch(size_t(12 * in));
    double* ys = buf.data();
    for (; b0 + 4 <= B; b0 += 4) {
      for (int64_t i = 0; i < in; ++i)
        for (int64_t l = 0; l < 4; ++l) {
          const TD& y = inp[(b0 + l) * in + i];
          ys[12 * i + l] = y.v.hi;
          ys[12 * i + 4 + l] = y.v.lo;
          ys[12 * i + 8 + l] = y.e.hi;
        }
      for (int64_t o = 0; o < out_dim; ++o) {
        const TD* w = &W[o * in];
        Acc a;
        for (int64_t i = 0; i < in; ++i) {
          d4 yh, yl, ye;
          __builtin_memcpy(&yh, &ys[12 * i], sizeof(d4));
          __builtin_memcpy(&yl, &ys[12 * i + 4], sizeof(d4));
          __builtin_memcpy(&ye, &ys[12 * i + 8], sizeof(d4));
          add_term(a, w[i], yh, yl, ye);
        }
        const TD& c = bias[o];
        const Fin f = finish(a, k, splat(c.v.hi), splat(c.v.lo), splat(c.e.hi));
        double vh[4], vl[4], e[4], M[4];  // lane by lane
        __builtin_memcpy(vh, &f.vh, sizeof vh);
        __builtin_memcpy(vl, &f.vl, sizeof vl);
        __builtin_memcpy(e, &f.e, sizeof e);
        __builtin_memcpy(M, &a.M, sizeof M);
        for (int64_t l = 0; l < 4; ++l) {
          TD& dst = out[(b0 + l) * out_dim + o];
          const TD* y = &inp[(b0 + l) * in];
          if ((f.bad >> l) & 1) {
            dot_into_dd(dst, &c, in, w, 1, y, 1, k);
            continue;
          }
          dst.v = DD::raw(vh[l], vl[l]);
          dst.e =
              ((f.exact >> l) & 1) && dot_exact_sum(&c, in, w, 1, y, 1, M[l])
                  ? DD(0.0)
                  : DD(e[l]);
        }
      }
    }
  }
  for (; b0 < B; ++b0)
    for (int64_t o = 0; o < out_dim; ++o)
      dot_into_dd(out[b0 * out_dim + o], &bias[o], in, &W[o * in], 1,
                  &inp[b0 * in], 1, k);
}

void input_grad(TD* dinp, const TD* dout, const TD* W, int64_t B, int64_t in,
                int64_t out_dim) {
  using namespace lanes_detail;
  const ReductionConstants k(out_dim, out_dim, true);
  int64_t b0 = 0;
  if (!k.unbounded && B >= 4) {
    // ys[12 o + {0, 4, 8} + lane]: dout[b0 + lane, o]'s v.hi, v.lo, e.hi.
    std::vector<double>& buf = scratch(size_t(12 * out_dim));
    double* ys = buf.data();
    for (; b0 + 4 <= B; b0 += 4) {
      for (int64_t o = 0; o < out_dim; ++o)
        for (int64_t l = 0; l < 4; ++l) {
          const TD& y = dout[(b0 + l) * out_dim + o];
          ys[12 * o + l] = y.v.hi;
          ys[12 * o + 4 + l] = y.v.lo;
          ys[12 * o + 8 + l] = y.e.hi;
        }
      for (int64_t i = 0; i < in; ++i) {
        // The terms dout[b, o] W[o, i]: x and y swapped against dot_into's
        // order, which the Dot2 step does not see (its products and sums
        // are commutative; the same doubles).
        Acc a;
        for (int64_t o = 0; o < out_dim; ++o) {
          d4 yh, yl, ye;
          __builtin_memcpy(&yh, &ys[12 * o], sizeof(d4));
          __builtin_memcpy(&yl, &ys[12 * o + 4], sizeof(d4));
          __builtin_memcpy(&ye, &ys[12 * o + 8], sizeof(d4));
          add_term(a, W[o * in + i], yh, yl, ye);
        }
        const Fin f = finish(a, k);
        double vh[4], vl[4], e[4], M[4];  // lane by lane
        __builtin_memcpy(vh, &f.vh, sizeof vh);
        __builtin_memcpy(vl, &f.vl, sizeof vl);
        __builtin_memcpy(e, &f.e, sizeof e);
        __builtin_memcpy(M, &a.M, sizeof M);
        for (int64_t l = 0; l < 4; ++l) {
          TD& dst = dinp[(b0 + l) * in + i];
          const TD* x = &dout[(b0 + l) * out_dim];
          if ((f.bad >> l) & 1) {
            dot_into_dd(dst, nullptr, out_dim, x, 1, &W[i], in, k);
            continue;
          }
          dst.v = DD::raw(vh[l], vl[l]);
          dst.e = ((f.exact >> l) & 1) &&
                          dot_exact_sum(nullptr, out_dim, x, 1, &W[i], in, M[l])
                      ? DD(0.0)
                      : DD(e[l]);
        }
      }
    }
  }
  for (; b0 < B; ++b0)
    for (int64_t i = 0; i < in; ++i)
      dot_into_dd(dinp[b0 * in + i], nullptr, out_dim, &dout[b0 * out_dim], 1,
                  &W[i], in, k);
}

void weight_grad(TD* dW, const TD* dout, const TD* inp, int64_t B, int64_t in,
                 int64_t out_dim) {
  using namespace lanes_detail;
  const ReductionConstants k(B + 1, B, true);
  const int64_t in4 = k.unbounded ? 0 : in / 4 * 4;
  // ys[(3 b + {0, 1, 2}) in + i]: inp[b, i]'s v.hi, v.lo, e.hi.
  std::vector<double>& buf = scratch(size_t(3 * B * in));
  double* ys = buf.data();
  if (in4 > 0)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < in; ++i) {
        const TD& y = inp[b * in + i];
        ys[(3 * b) * in + i] = y.v.hi;
        ys[(3 * b + 1) * in + i] = y.v.lo;
        ys[(3 * b + 2) * in + i] = y.e.hi;
      }
  for (int64_t o = 0; o < out_dim; ++o) {
    TD* row = &dW[o * in];
    for (int64_t i = 0; i < in4; i += 4) {
      Acc a;
      for (int64_t b = 0; b < B; ++b) {
        d4 yh, yl, ye;
        __builtin_memcpy(&yh, &ys[(3 * b) * in + i], sizeof(d4));
        __builtin_memcpy(&yl, &ys[(3 * b + 1) * in + i], sizeof(d4));
        __builtin_memcpy(&ye, &ys[(3 * b + 2) * in + i], sizeof(d4));
        add_term(a, dout[b * out_dim + o], yh, yl, ye);
      }
      d4 ih, il, ie;
      load4(&row[i], ih, il, ie);
      const Fin f = finish(a, k, ih, il, ie);
      if ((f.bad | f.exact) == 0) {
        store4(&row[i], f.vh, f.vl, f.e);
        continue;
      }
      // Lane by lane (copied out of the vectors here only, so that the
      // common path keeps them in registers).
      double vh[4], vl[4], e[4], M[4];
      __builtin_memcpy(vh, &f.vh, sizeof vh);
      __builtin_memcpy(vl, &f.vl, sizeof vl);
      __builtin_memcpy(e, &f.e, sizeof e);
      __builtin_memcpy(M, &a.M, sizeof M);
      for (int64_t l = 0; l < 4; ++l) {
        TD& dst = row[i + l];
        if ((f.bad >> l) & 1) {
          dot_into_dd(dst, &dst, B, &dout[o], out_dim, &inp[i + l], in, k);
          continue;
        }
        const bool ex =
            ((f.exact >> l) & 1) &&
            dot_exact_sum(&dst, B, &dout[o], out_dim, &inp[i + l], in, M[l]);
        dst.v = DD::raw(vh[l], vl[l]);
        dst.e = ex ? DD(0.0) : DD(e[l]);
      }
    }
    for (int64_t i = in4; i < in; ++i)
      dot_into_dd(row[i], &row[i], B, &dout[o], out_dim, &inp[i], in, k);
  }
}

}  // namespace accumcheck::dd_lanes

namespace accumcheck::dd_lanes {

namespace {

// Adam's scalars as lanes.
struct AdamLanes {
  lanes_detail::T4 decay, wd, beta1, beta2, omb1, omb2, bc2, eps, step;
};

// adam_step on N groups of four elements from i: each Tracked operation
// for every group before the next one (their dependent chains, the sqrt
// and two DD divisions, overlap in the core); a group with a lane off the
// common path is redone by the scalar loop.  g and tmp as the scalar loop
// leaves them after the last group.
template <int N>
ACCUMCHECK_DD_INLINE void adam_groups(int64_t i, TD* p, const TD* grad, TD* m,
                                      TD* v, const AdamScalars<TD>& sc,
                                      const AdamLanes& k, TD& gl, TD& tl) {
  using namespace lanes_detail;
  i4 bad[N] = {};
  T4 P[N], G[N], M[N], V[N], D[N];
  for (int q = 0; q < N; ++q) {
    const int64_t j = i + 4 * q;
    load4(&p[j], P[q].h, P[q].l, P[q].e);
    load4(&grad[j], G[q].h, G[q].l, G[q].e);
    load4(&m[j], M[q].h, M[q].l, M[q].e);
    load4(&v[j], V[q].h, V[q].l, V[q].e);
  }
  if (sc.decoupled)
    for (int q = 0; q < N; ++q) P[q] = tmul(P[q], k.decay, bad[q]);
  if (sc.coupled)
    for (int q = 0; q < N; ++q)
      G[q] = tadd(G[q], tmul(P[q], k.wd, bad[q]), bad[q]);
  for (int q = 0; q < N; ++q) M[q] = tmul(M[q], k.beta1, bad[q]);
  for (int q = 0; q < N; ++q)
    M[q] = tadd(M[q], tmul(G[q], k.omb1, bad[q]), bad[q]);
  for (int q = 0; q < N; ++q) V[q] = tmul(V[q], k.beta2, bad[q]);
  for (int q = 0; q < N; ++q)
    V[q] = tadd(V[q], tmul(tmul(G[q], G[q], bad[q]), k.omb2, bad[q]), bad[q]);
  for (int q = 0; q < N; ++q) D[q] = tsqrt(V[q], bad[q]);
  for (int q = 0; q < N; ++q) D[q] = tdiv(D[q], k.bc2, bad[q]);
  for (int q = 0; q < N; ++q) D[q] = tadd(D[q], k.eps, bad[q]);
  for (int q = 0; q < N; ++q) G[q] = tdiv(M[q], D[q], bad[q]);
  for (int q = 0; q < N; ++q) G[q] = tmul(G[q], k.step, bad[q]);
  for (int q = 0; q < N; ++q) P[q] = tsub(P[q], G[q], bad[q]);
  for (int q = 0; q < N; ++q) {
    const int64_t j = i + 4 * q;
    if (bits(bad[q]) != 0) {
      layers_detail::adam_loop(4, &p[j], &grad[j], &m[j], &v[j], sc, gl, tl);
      continue;
    }
    store4(&p[j], P[q].h, P[q].l, P[q].e);
    store4(&m[j], M[q].h, M[q].l, M[q].e);
    store4(&v[j], V[q].h, V[q].l, V[q].e);
    gl = TD(DD::raw(G[q].h[3], G[q].l[3]), DD(G[q].e[3]));
    tl = TD(DD::raw(D[q].h[3], D[q].l[3]), DD(D[q].e[3]));
  }
}

}  // namespace

void adam_step(int64_t n, TD* p, const TD* grad, TD* m, TD* v,
               const AdamScalars<TD>& s, TD& g, TD& tmp) {
  using namespace lanes_detail;
  const AdamScalars<TD> sc = s;
  TD gl = g, tl = tmp;
  const AdamLanes k{splat(sc.decay),           splat(sc.weight_decay),
                    splat(sc.beta1),           splat(sc.beta2),
                    splat(sc.one_minus_beta1), splat(sc.one_minus_beta2),
                    splat(sc.bc2_sqrt),        splat(sc.eps),
                    splat(sc.step_size)};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) adam_groups<2>(i, p, grad, m, v, sc, k, gl, tl);
  for (; i + 4 <= n; i += 4) adam_groups<1>(i, p, grad, m, v, sc, k, gl, tl);
  layers_detail::adam_loop(n - i, &p[i], &grad[i], &m[i], &v[i], sc, gl, tl);
  g = gl;
  tmp = tl;
}

}  // namespace accumcheck::dd_lanes

namespace accumcheck::dd_lanes {

namespace {

using namespace lanes_detail;

// DD values on four lanes, DD's operations (oracle/dd.hpp) lane by lane
// (lanes_detail's dd_add, dd_mul, dd_div); `bad` marks a lane where the
// scalar operation leaves its common path (a non-finite sum, product or
// quotient).
struct D4 {
  d4 h, l;
};
ACCUMCHECK_DD_INLINE D4 add4(D4 a, D4 b, i4& bad) {
  D4 r;
  dd_add(a.h, a.l, b.h, b.l, r.h, r.l, bad);
  return r;
}
ACCUMCHECK_DD_INLINE D4 neg4(D4 a) { return {-a.h, -a.l}; }
ACCUMCHECK_DD_INLINE D4 mul4(D4 a, D4 b, i4& bad) {
  D4 r;
  dd_mul(a.h, a.l, b.h, b.l, r.h, r.l, bad);
  return r;
}
ACCUMCHECK_DD_INLINE D4 div4(D4 a, D4 b, i4& bad) {
  D4 r;
  dd_div(a.h, a.l, b.h, b.l, r.h, r.l, bad);
  return r;
}
ACCUMCHECK_DD_INLINE D4 scale4(D4 a, d4 p) { return {a.h * p, a.l * p}; }
ACCUMCHECK_DD_INLINE D4 splat4(const DD& x) {
  return {splat(x.hi), splat(x.lo)};
}
ACCUMCHECK_DD_INLINE D4 select4(i4 m, D4 a, D4 b) {
  return {m ? a.h : b.h, m ? a.l : b.l};
}

// dd_detail::expm1_reduced per lane, on N groups of four lanes: each
// operation for every group before the next one, so that the groups'
// dependent chains (about 40 DD operations) overlap in the core.
template <int N>
ACCUMCHECK_DD_INLINE void expm1_reduced4(D4 (&s)[N], const D4 (&r)[N],
                                         i4 (&bad)[N]) {
  const DD* f = dd_detail::inverse_factorials();
  D4 x[N];
  for (int g = 0; g < N; ++g) {
    x[g] = scale4(r[g], splat(0x1p-9));
    s[g] = splat4(f[10]);
  }
  for (int k = 9; k >= 1; --k)
    for (int g = 0; g < N; ++g)
      s[g] = add4(splat4(f[k]), mul4(x[g], s[g], bad[g]), bad[g]);
  for (int g = 0; g < N; ++g) s[g] = mul4(x[g], s[g], bad[g]);
  for (int i = 0; i < 9; ++i)
    for (int g = 0; g < N; ++g)
      s[g] = add4(scale4(s[g], splat(2)), mul4(s[g], s[g], bad[g]), bad[g]);
}

// dd.cpp's tanh per lane: x = |a|, m = expm1(2x) (expm1_reduced for
// |2x| <= 0.34, else exp(2x) - 1 by exp's reduction), m / (m + 2), the
// sign of a; on N groups of four lanes, as expm1_reduced4.  Bit l of
// scalar[g]: lane l of group g to be computed by the scalar tanh.
template <int N>
ACCUMCHECK_DD_INLINE void tanh4(const D4 (&a)[N], D4 (&out)[N],
                                int (&scalar)[N]) {
  const d4 zero{};
  const DD& ln2 = dd_detail::ln2();
  i4 bad[N], neg[N], small[N];
  D4 arg[N], y[N];
  d4 p[N];
  for (int g = 0; g < N; ++g) {
    bad[g] = a[g].h != a[g].h;  // NaN
    neg[g] = a[g].h < zero;
    const D4 x = select4(neg[g], neg4(a[g]), a[g]);
    bad[g] |= x.h > splat(40);
    y[g] = scale4(x, splat(2));
    small[g] = ~(fabs4(y[g].h) > splat(0.34));
    // exp(y)'s reduction: k = nearbyint(y / ln2), r = y - ln2 k.
    const d4 q = y[g].h / splat(ln2.hi);
    d4 k;
    for (int j = 0; j < 4; ++j) {
      k[j] = std::nearbyint(q[j]);
      // times_pow2's 2^k (k <= 116 where no lane is bad)
      const int kk =
          std::isfinite(k[j]) && std::fabs(k[j]) < 1000 ? int(k[j]) : 0;
      p[g][j] = std::ldexp(1.0, kk);
    }
    const D4 r_exp =
        add4(y[g], neg4(mul4(splat4(ln2), {k, zero}, bad[g])), bad[g]);
    arg[g] = select4(small[g], y[g], r_exp);
  }
  D4 s[N];
  expm1_reduced4(s, arg, bad);
  for (int g = 0; g < N; ++g) {
    const D4 e = scale4(add4(s[g], {splat(1), zero}, bad[g]), p[g]);
    const D4 m =
        select4(small[g], s[g], add4(e, neg4({splat(1), zero}), bad[g]));
    const D4 t = div4(m, add4(m, {splat(2), zero}, bad[g]), bad[g]);
    out[g] = select4(neg[g], neg4(t), t);
    scalar[g] = bits(bad[g]);
  }
}

// tracked_detail::tanh_bound per lane, the input a +- (e, el) and the
// value t: the bound's high part (its low part is 0).  Bit l of the
// result: lane l to take Tracked::tanh_of's general path (tanh_bound
// returns false there).
ACCUMCHECK_DD_INLINE int tanh_bound4(D4 a, d4 e, d4 el, D4 t, d4& out) {
  constexpr double ku = error_model::kTanhUlp * error_model::kUnitRoundoff32;
  constexpr double up = 1 + 0x1p-50;
  const d4 zero{};
  i4 general = ~(e < splat(std::numeric_limits<double>::infinity()));
  // m = abs(a) - e (DD), its sign exact.
  const i4 neg = a.h < zero;
  const D4 x = select4(neg, neg4(a), a);
  D4 m;
  i4 bad{};
  dd_add(x.h, x.l, -e, -el, m.h, m.l, bad);
  const d4 tu = fabs4(t.h) * splat(1 + 0x1p-51);
  const d4 exu = e * splat(1 + 0x1p-51);
  // sech^2 |x| = 1 - tanh^2 |x|, bounded over the interval.
  D4 sq, q;
  dd_mul(t.h, t.l, t.h, t.l, sq.h, sq.l, bad);
  dd_add(splat(1), zero, -sq.h, -sq.l, q.h, q.l, bad);
  const d4 qh = q.h > zero ? q.h : zero;
  const d4 qu = (qh * splat(1 + 0x1p-52) + splat(0x1p-96)) * splat(up);
  const d4 ql = qh * splat(1 - 0x1p-50) - splat(0x1p-96);
  const d4 exl = e * splat(1 - 0x1p-51);
  const d4 z = ql > zero ? exl * exl * ql * splat(1 - 0x1p-50) : zero;
  d4 y = (splat(2) * exu * tu * splat(up) - z) * splat(up);
  y = y < zero ? zero : y;
  const i4 interval = (m.h > zero) & (e > zero);
  general |= interval & ~(y <= splat(0x1p-10));
  const d4 G = (splat(1) + y + y * y * (splat(0.5) + y)) * splat(up);
  d4 S = qu * G * splat(up);
  S = S > splat(1) ? splat(1) : S;
  S = interval ? S : splat(1);
  d4 T = exu * S * splat(up);
  T = T > splat(2) ? splat(2) : T;
  out = (T + splat(ku) * (tu + T)) * splat(kUpDD);
  return bits(general | bad);
}

// dd.cpp's exp per lane, on N groups of four lanes as expm1_reduced4:
// k = nearbyint(a / ln2), exp = (expm1(a - ln2 k) + 1) 2^k.  Bit l of
// scalar[g]: lane l of group g to be computed by the scalar exp (NaN,
// a > 709.7 or a < -745.2, 2^k not a normal double).
template <int N>
ACCUMCHECK_DD_INLINE void exp4(const D4 (&a)[N], D4 (&out)[N],
                               int (&scalar)[N]) {
  const d4 zero{};
  const DD& ln2 = dd_detail::ln2();
  i4 bad[N];
  D4 r[N];
  d4 p[N];
  for (int g = 0; g < N; ++g) {
    bad[g] = ~(a[g].h <= splat(709.7)) | (a[g].h < splat(-745.2));
    const d4 q = a[g].h / splat(ln2.hi);
    d4 k;
    for (int j = 0; j < 4; ++j) {
      k[j] = std::nearbyint(q[j]);
      const bool normal = k[j] >= -1022 && k[j] <= 1023;  // false for NaN
      p[g][j] = std::ldexp(1.0, normal ? int(k[j]) : 0);
      if (!normal) bad[g][j] = -1;
    }
    r[g] = add4(a[g], neg4(mul4(splat4(ln2), {k, zero}, bad[g])), bad[g]);
  }
  D4 s[N];
  expm1_reduced4(s, r, bad);
  for (int g = 0; g < N; ++g) {
    out[g] = scale4(add4(s[g], {splat(1), zero}, bad[g]), p[g]);
    scalar[g] = bits(bad[g]);
  }
}

// N groups of four elements of exp_forward, from inp[i].
template <int N>
ACCUMCHECK_DD_INLINE void exp_groups(TD* out, const TD* inp, int64_t i) {
  using std::exp;
  TD x[N][4];
  D4 a[N], t[N];
  d4 e;
  int scalar[N];
  for (int g = 0; g < N; ++g) {
    for (int k = 0; k < 4; ++k) x[g][k] = inp[i + 4 * g + k];
    load4(x[g], a[g].h, a[g].l, e);
  }
  exp4(a, t, scalar);
  for (int g = 0; g < N; ++g)
    for (int k = 0; k < 4; ++k)
      out[i + 4 * g + k] =
          (scalar[g] >> k) & 1
              ? exp(x[g][k])
              : TD::exp_of(x[g][k], DD::raw(t[g].h[k], t[g].l[k]));
}

// N groups of four elements of tanh_forward, from inp[i].
template <int N>
ACCUMCHECK_DD_INLINE void tanh_groups(TD* out, const TD* inp, int64_t i) {
  using std::tanh;
  TD x[N][4];
  D4 a[N], t[N];
  d4 e[N], el[N], bound[N];
  int scalar[N], general[N];
  for (int g = 0; g < N; ++g) {
    for (int k = 0; k < 4; ++k) x[g][k] = inp[i + 4 * g + k];
    load4(x[g], a[g].h, a[g].l, e[g]);
    el[g] = d4{x[g][0].e.lo, x[g][1].e.lo, x[g][2].e.lo, x[g][3].e.lo};
  }
  tanh4(a, t, scalar);
  for (int g = 0; g < N; ++g)
    general[g] = tanh_bound4(a[g], e[g], el[g], t[g], bound[g]);
  for (int g = 0; g < N; ++g)
    for (int k = 0; k < 4; ++k) {
      TD& o = out[i + 4 * g + k];
      if ((scalar[g] >> k) & 1)
        o = TD::tanh_of(x[g][k], tanh(x[g][k].v));
      else if ((general[g] >> k) & 1)
        o = TD::tanh_of(x[g][k], DD::raw(t[g].h[k], t[g].l[k]));
      else
        o = TD(DD::raw(t[g].h[k], t[g].l[k]), DD(bound[g][k]));
    }
}

}  // namespace

void tanh_forward(TD* out, const TD* inp, int64_t n) {
  using std::tanh;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) tanh_groups<2>(out, inp, i);
  for (; i + 4 <= n; i += 4) tanh_groups<1>(out, inp, i);
  for (; i < n; ++i) out[i] = tanh(inp[i]);
}

void exp_forward(TD* out, const TD* inp, int64_t n) {
  using std::exp;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) exp_groups<2>(out, inp, i);
  for (; i + 4 <= n; i += 4) exp_groups<1>(out, inp, i);
  for (; i < n; ++i) out[i] = exp(inp[i]);
}

}  // namespace accumcheck::dd_lanes

namespace accumcheck::error_model {

namespace {

using namespace dd_lanes::lanes_detail;
using dd_lanes::TD;

template <class F>
ACCUMCHECK_DD_INLINE d4 widen4(const F* f) {
  if constexpr (std::is_same_v<F, float>) {
    using f4 = float __attribute__((vector_size(16)));
    f4 x;
    std::memcpy(&x, f, sizeof x);
    return __builtin_convertvector(x, d4);
  } else {
    d4 x;
    std::memcpy(&x, f, sizeof x);
    return x;
  }
}

// compare()'s scalar DD code per element (error_model.hpp), four lanes.
template <class F>
ACCUMCHECK_DD_INLINE void lanes(const F* f, const TD* v, double scale,
                                double slack, CompareLanes& out) {
  const d4 zero{};
  d4 vh, vl, eh;
  load4(v, vh, vl, eh);
  const d4 el{v[0].e.lo, v[1].e.lo, v[2].e.lo, v[3].e.lo};  // load4: e.hi
  i4 bad{};
  // err = abs(DD(f) - v): DD(f) + (-v), operator+.
  d4 sh, sl;
  dd_add(widen4(f), zero, -vh, -vl, sh, sl, bad);
  const i4 neg = sh < zero;
  const d4 erh = neg ? -sh : sh, erl = neg ? -sl : sl;
  // bound = e * scale; slack * bound.
  d4 bh, bl, kh, kl;
  dd_mul(eh, el, splat(scale), zero, bh, bl, bad);
  dd_mul(splat(slack), zero, bh, bl, kh, kl, bad);
  // err <= slack * bound: a < b || a == b (false for a NaN).
  const i4 ok =
      (erh < kh) | ((erh == kh) & (erl < kl)) | ((erh == kh) & (erl == kl));
  // ratio_below_maxima's bound on err / bound.
  const d4 tiny = splat(0x1p-1000);
  const i4 ez = erh == zero;
  const i4 ub_ok = ez | ((erh >= tiny) & (bh >= tiny) &
                         (bh < splat(std::numeric_limits<double>::infinity())));
  const d4 q = (erh / bh) * splat(1 + 0x1p-48);
  const d4 ub = ez ? zero : q;
  // count_error: err / (u max(|v|, 2^-126)), v and err as doubles.
  const d4 av = fabs4(vh + vl);
  const d4 lowest = splat(0x1p-126);
  const d4 sc = av < lowest ? lowest : av;
  const d4 eu = (erh + erl) / (splat(kUnitRoundoff32) * sc);
  for (int k = 0; k < 4; ++k) {
    out.err_hi[k] = erh[k];
    out.err_lo[k] = erl[k];
    out.bound_hi[k] = bh[k];
    out.bound_lo[k] = bl[k];
    out.ub[k] = ub[k];
    out.err_u[k] = eu[k];
  }
  out.violated = bits(~ok);
  out.ub_ok = bits(ub_ok);
  out.scalar = bits(bad);
}

}  // namespace

void compare_lanes(const float* f, const TD* v, double scale, double slack,
                   CompareLanes& out) {
  lanes(f, v, scale, slack, out);
}
void compare_lanes(const double* f, const TD* v, double scale, double slack,
                   CompareLanes& out) {
  lanes(f, v, scale, slack, out);
}

}  // namespace accumcheck::error_model
