// oracle/dd_lanes.hpp: the elementwise transcendentals (tanh, the
// softmax's exp), their DD values and Tracked bounds in lanes.
#include <cmath>

#include "oracle/dd_lanes.hpp"
#include "oracle/dd_lanes_detail.hpp"

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

enum class Kernel { tanh, exp };

// N groups of four elements of tanh_forward or exp_forward, from inp[i]:
// the values by tanh4 / exp4, the bounds by tanh_bound4 / exp_of; a lane
// off the lanes' path by the scalar function.
template <Kernel F, int N>
ACCUMCHECK_DD_INLINE void groups(TD* out, const TD* inp, int64_t i) {
  using std::exp;
  using std::tanh;
  TD x[N][4];
  D4 a[N], t[N];
  d4 e[N], bound[N];
  int scalar[N], general[N] = {};
  for (int g = 0; g < N; ++g) {
    for (int k = 0; k < 4; ++k) x[g][k] = inp[i + 4 * g + k];
    load4(x[g], a[g].h, a[g].l, e[g]);
  }
  if constexpr (F == Kernel::tanh) {
    tanh4(a, t, scalar);
    for (int g = 0; g < N; ++g) {
      const d4 el{x[g][0].e.lo, x[g][1].e.lo, x[g][2].e.lo, x[g][3].e.lo};
      general[g] = tanh_bound4(a[g], e[g], el, t[g], bound[g]);
    }
  } else {
    exp4(a, t, scalar);
  }
  for (int g = 0; g < N; ++g)
    for (int k = 0; k < 4; ++k) {
      TD& o = out[i + 4 * g + k];
      const TD& xk = x[g][k];
      const DD value = DD::raw(t[g].h[k], t[g].l[k]);
      if constexpr (F == Kernel::tanh) {
        if ((scalar[g] >> k) & 1)
          o = TD::tanh_of(xk, tanh(xk.v));
        else if ((general[g] >> k) & 1)
          o = TD::tanh_of(xk, value);
        else
          o = TD(value, DD(bound[g][k]));
      } else {
        o = (scalar[g] >> k) & 1 ? exp(xk) : TD::exp_of(xk, value);
      }
    }
}

// Eight elements at a time, then four, then the rest by the scalar
// function.
template <Kernel F>
void elementwise(TD* out, const TD* inp, int64_t n) {
  using std::exp;
  using std::tanh;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) groups<F, 2>(out, inp, i);
  for (; i + 4 <= n; i += 4) groups<F, 1>(out, inp, i);
  for (; i < n; ++i) out[i] = F == Kernel::tanh ? tanh(inp[i]) : exp(inp[i]);
}

}  // namespace

void tanh_forward(TD* out, const TD* inp, int64_t n) {
  elementwise<Kernel::tanh>(out, inp, n);
}

void exp_forward(TD* out, const TD* inp, int64_t n) {
  elementwise<Kernel::exp>(out, inp, n);
}

}  // namespace accumcheck::dd_lanes
