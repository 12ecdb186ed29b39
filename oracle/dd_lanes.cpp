// oracle/dd_lanes.hpp: the Linear kernels (Tracked<DD> reductions four
// outputs at a time, bit for bit tracked_detail::dot_into_dd,
// oracle/tracked_dd_reductions.hpp) and Adam's step.
#include "oracle/dd_lanes.hpp"

#include <vector>

#include "oracle/dd_lanes_detail.hpp"

namespace accumcheck::dd_lanes {

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

void adam_step(int64_t n, double* p, const double* grad, double* m, double* v,
               const AdamScalars<double>& s) {
  using namespace lanes_detail;
  const d4 decay = splat(s.decay), wd = splat(s.weight_decay),
           beta1 = splat(s.beta1), beta2 = splat(s.beta2),
           omb1 = splat(s.one_minus_beta1), omb2 = splat(s.one_minus_beta2),
           bc2 = splat(s.bc2_sqrt), eps = splat(s.eps),
           step = splat(s.step_size);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    d4 pi = load4(&p[i]);
    if (s.decoupled) pi = pi * decay;
    d4 g = load4(&grad[i]);
    if (s.coupled) g = g + pi * wd;
    const d4 mi = load4(&m[i]) * beta1 + g * omb1;
    const d4 vi = load4(&v[i]) * beta2 + (g * g) * omb2;
    const d4 denom = sqrt4(vi) / bc2 + eps;
    store4(&m[i], mi);
    store4(&v[i], vi);
    store4(&p[i], pi - (mi / denom) * step);
  }
  double g = 0, tmp = 0;
  layers_detail::adam_loop(n - i, &p[i], &grad[i], &m[i], &v[i], s, g, tmp);
}

}  // namespace accumcheck::dd_lanes
