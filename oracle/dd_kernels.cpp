// oracle/dd_kernels.hpp: every output element is the reduction dot_into
// (oracle/tracked.hpp) computes for it, term by term in the same order with
// the same double operations (tracked_detail::Dot2Acc), so values and
// bounds are bit for bit dot_into's; only kLanes independent outputs run
// side by side, their inputs laid out as arrays of lanes (structure of
// arrays) so that each step is one vector operation per formula.  An
// output whose inputs are all exact (bound 0) takes dot_into itself (the
// exact-case test); a remainder of fewer than kLanes outputs too.
#include "oracle/dd_kernels.hpp"

#include <vector>

namespace accumcheck {

namespace {

using tracked_detail::DDReductionBound;
using tracked_detail::Dot2Acc;
using TD = Tracked<DD>;

constexpr int64_t kLanes = 8;

// The value and bound parts of kLanes Tracked values (structure of arrays).
struct Soa {
  double h[kLanes], l[kLanes], e[kLanes];
  ACCUMCHECK_DD_INLINE void load(const TD* p, int64_t stride) {
    for (int64_t k = 0; k < kLanes; ++k) {
      h[k] = p[k * stride].v.hi;
      l[k] = p[k * stride].v.lo;
      e[k] = p[k * stride].e.hi;
    }
  }
};

// kLanes reductions stepped together: one term x y each, x or y the same
// in every lane.
struct Lanes {
  Dot2Acc acc[kLanes];
  ACCUMCHECK_DD_INLINE void add(const Soa& x, const TD& y) {
    for (int64_t l = 0; l < kLanes; ++l)
      acc[l].add(x.h[l], x.l[l], x.e[l], y.v.hi, y.v.lo, y.e.hi);
  }
  ACCUMCHECK_DD_INLINE void add(const TD& x, const Soa& y) {
    for (int64_t l = 0; l < kLanes; ++l)
      acc[l].add(x.v.hi, x.v.lo, x.e.hi, y.h[l], y.l[l], y.e[l]);
  }
};

}  // namespace

void linear_forward(TD* out, const TD* inp, const TD* W, const TD* bias,
                    int64_t B, int64_t in, int64_t out_dim) {
  // Lanes over o: ws[i] holds W[o0 + l, i], transposed once per group of
  // kLanes rows and used by every row b.
  const DDReductionBound bound(in + 1, in, true);
  std::vector<Soa> ws(static_cast<size_t>(in));
  int64_t o0 = 0;
  for (; o0 + kLanes <= out_dim; o0 += kLanes) {
    for (int64_t i = 0; i < in; ++i) ws[size_t(i)].load(&W[o0 * in + i], in);
    for (int64_t b = 0; b < B; ++b) {
      const TD* x = &inp[b * in];
      Lanes L;
      // dot_into's order: x = W (a), y = inp (b).
      for (int64_t i = 0; i < in; ++i) L.add(ws[size_t(i)], x[i]);
      for (int64_t l = 0; l < kLanes; ++l) {
        const int64_t o = o0 + l;
        TD& r = out[b * out_dim + o];
        if (L.acc[l].maybe_exact(&bias[o]))
          dot_into(r, &bias[o], in, &W[o * in], 1, x, 1);
        else
          L.acc[l].finish(r, &bias[o], bound);
      }
    }
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t o = o0; o < out_dim; ++o)
      dot_into(out[b * out_dim + o], &bias[o], in, &W[o * in], 1, &inp[b * in],
               1);
}

void linear_backward(TD* dinp, TD* dW, TD* dbias, const TD* dout, const TD* inp,
                     const TD* W, int64_t B, int64_t in, int64_t out_dim) {
  const int64_t i_full = in - in % kLanes;
  if (dinp) {
    // dinp[b, i] = sum_o dout[b, o] W[o, i]: lanes over i.
    const DDReductionBound bound(out_dim, out_dim, true);
    for (int64_t b = 0; b < B; ++b) {
      const TD* x = &dout[b * out_dim];
      for (int64_t i0 = 0; i0 < i_full; i0 += kLanes) {
        Lanes L;
        for (int64_t o = 0; o < out_dim; ++o) {
          Soa y;
          y.load(&W[o * in + i0], 1);
          L.add(x[o], y);
        }
        for (int64_t l = 0; l < kLanes; ++l) {
          TD& r = dinp[b * in + i0 + l];
          if (L.acc[l].maybe_exact(nullptr))
            dot_into(r, static_cast<const TD*>(nullptr), out_dim, x, 1,
                     &W[i0 + l], in);
          else
            L.acc[l].finish(r, nullptr, bound);
        }
      }
      for (int64_t i = i_full; i < in; ++i)
        dot_into(dinp[b * in + i], static_cast<const TD*>(nullptr), out_dim, x,
                 1, &W[i], in);
    }
  }
  // dW[o, i] += sum_b dout[b, o] inp[b, i]: lanes over i.
  const DDReductionBound bound(B + 1, B, true);
  for (int64_t o = 0; o < out_dim; ++o) {
    for (int64_t i0 = 0; i0 < i_full; i0 += kLanes) {
      Lanes L;
      for (int64_t b = 0; b < B; ++b) {
        Soa y;
        y.load(&inp[b * in + i0], 1);
        L.add(dout[b * out_dim + o], y);
      }
      for (int64_t l = 0; l < kLanes; ++l) {
        TD& r = dW[o * in + i0 + l];
        if (L.acc[l].maybe_exact(&r))
          dot_into(r, &r, B, &dout[o], out_dim, &inp[i0 + l], in);
        else
          L.acc[l].finish(r, &r, bound);
      }
    }
    for (int64_t i = i_full; i < in; ++i)
      dot_into(dW[o * in + i], &dW[o * in + i], B, &dout[o], out_dim, &inp[i],
               in);
    sum_into(dbias[o], &dbias[o], B, &dout[o], out_dim);
  }
}

}  // namespace accumcheck
