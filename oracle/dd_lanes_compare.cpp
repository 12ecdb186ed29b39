// error_model::compare's per-element terms in lanes
// (oracle/error_model.hpp, compare_lanes).
#include <cstring>
#include <type_traits>

#include "oracle/dd_lanes_detail.hpp"
#include "oracle/error_model.hpp"

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
