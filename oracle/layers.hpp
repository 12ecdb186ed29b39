// The oracle's layers, losses and optimizer updates: forward and backward
// side by side (llm.c style), each saying whether it SETS or ACCUMULATES,
// under the names the device engine's kernels use.  Generic over the
// number type: OracleReal (the oracle), Tracked<OracleReal> (the same
// formulas with the float32 error bound; the order each formula rounds in
// is part of the device contract), float (a naive float32 reference).
// Oracle<T> (oracle/oracle.hpp) drives them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "oracle/dd_lanes.hpp"
#include "oracle/real.hpp"
#include "oracle/tracked.hpp"
#include "sim/engine.hpp"
#include "sim/layout.hpp"
#include "sim/rng.hpp"
#include "sim/scenario.hpp"

namespace accumcheck {

// ---------------------------------------------------------------- layers

// out[b, o] = bias[o] + sum_i W[o, i] inp[b, i]         (SETS out)
// One reduction of in + 1 terms per output (the bias is its initial value;
// a GEMM followed by a bias add rounds no worse).
template <class T>
void linear_forward(T* out, const T* inp, const T* W, const T* bias, int64_t B,
                    int64_t in, int64_t out_dim) {
  if constexpr (std::is_same_v<T, Tracked<DD>>) {
    // The same reductions, four rows at a time (bit for bit).
    dd_lanes::linear_forward(out, inp, W, bias, B, in, out_dim);
    return;
  } else if constexpr (std::is_same_v<T, double>) {
    // The same sums (from 0, term by term in i's order, then the bias),
    // four outputs at a time: four independent chains of additions
    // instead of one (certify's cheap ranking runs every candidate on a
    // double oracle).  Bit for bit (OracleDouble.LinearKernelsAreTheSums).
    for (int64_t b = 0; b < B; ++b) {
      const double* x = &inp[b * in];
      double* y = &out[b * out_dim];
      int64_t o = 0;
      for (; o + 4 <= out_dim; o += 4) {
        const double *w0 = &W[o * in], *w1 = w0 + in, *w2 = w1 + in,
                     *w3 = w2 + in;
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (int64_t i = 0; i < in; ++i) {
          a0 += w0[i] * x[i];
          a1 += w1[i] * x[i];
          a2 += w2[i] * x[i];
          a3 += w3[i] * x[i];
        }
        y[o] = a0 + bias[o];
        y[o + 1] = a1 + bias[o + 1];
        y[o + 2] = a2 + bias[o + 2];
        y[o + 3] = a3 + bias[o + 3];
      }
      for (; o < out_dim; ++o)
        dot_into(y[o], &bias[o], in, &W[o * in], 1, x, 1);
    }
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t o = 0; o < out_dim; ++o)
        dot_into(out[b * out_dim + o], &bias[o], in, &W[o * in], 1,
                 &inp[b * in], 1);
  }
}

// dinp[b, i]  = sum_o dout[b, o] W[o, i]                (SETS; skipped if null)
// dW[o, i]   += sum_b dout[b, o] inp[b, i]              (ACCUMULATES)
// dbias[o]   += sum_b dout[b, o]                        (ACCUMULATES)
// Each accumulation is one reduction whose initial value is the old grad.
template <class T>
void linear_backward(T* dinp, T* dW, T* dbias, const T* dout, const T* inp,
                     const T* W, int64_t B, int64_t in, int64_t out_dim) {
  if constexpr (std::is_same_v<T, Tracked<DD>>) {
    // The same reductions, four at a time (bit for bit).
    if (dinp) dd_lanes::input_grad(dinp, dout, W, B, in, out_dim);
    dd_lanes::weight_grad(dW, dout, inp, B, in, out_dim);
  } else if constexpr (std::is_same_v<T, double>) {
    // The same sums element by element (from 0, term by term in the
    // order of o, resp. b, then dW's old value), a row of outputs at
    // once: contiguous and independent, so the compiler vectorizes
    // across outputs, never within a sum (OracleDouble.
    // LinearKernelsAreTheSums).
    if (dinp)
      for (int64_t b = 0; b < B; ++b) {
        double* acc = &dinp[b * in];
        std::fill(acc, acc + in, 0.0);
        for (int64_t o = 0; o < out_dim; ++o) {
          const double d = dout[b * out_dim + o];
          const double* w = &W[o * in];
          for (int64_t i = 0; i < in; ++i) acc[i] += d * w[i];
        }
      }
    thread_local std::vector<double> acc;
    acc.resize(size_t(in));
    for (int64_t o = 0; o < out_dim; ++o) {
      std::fill(acc.begin(), acc.end(), 0.0);
      double* a = acc.data();
      for (int64_t b = 0; b < B; ++b) {
        const double d = dout[b * out_dim + o];
        const double* x = &inp[b * in];
        for (int64_t i = 0; i < in; ++i) a[i] += d * x[i];
      }
      double* g = &dW[o * in];
      for (int64_t i = 0; i < in; ++i) g[i] = a[i] + g[i];
    }
  } else {
    if (dinp)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < in; ++i)
          dot_into(dinp[b * in + i], static_cast<const T*>(nullptr), out_dim,
                   &dout[b * out_dim], 1, &W[i], in);
    for (int64_t o = 0; o < out_dim; ++o)
      for (int64_t i = 0; i < in; ++i)
        dot_into(dW[o * in + i], &dW[o * in + i], B, &dout[o], out_dim, &inp[i],
                 in);
  }
  for (int64_t o = 0; o < out_dim; ++o)
    sum_into(dbias[o], &dbias[o], B, &dout[o], out_dim);
}

// Constants a float32 engine stores rounded to float.
template <class T>
struct ActivationConstants {
  using H = typename Num<T>::Host;
  T one = T(1), half = T(0.5), zero = T(0);
  T inv_sqrt2;     // 1/sqrt(2)
  T inv_sqrt_2pi;  // 1/sqrt(2 pi)
  ActivationConstants() {
    using std::acos;
    using std::sqrt;
    inv_sqrt2 = Num<T>::from_constant(H(H(1) / sqrt(H(2))));
    inv_sqrt_2pi = Num<T>::from_constant(H(H(1) / sqrt(H(H(2) * acos(H(-1))))));
  }
};

// out = act(inp), elementwise                           (SETS)
//   tanh: tanh(x)            relu: x > 0 ? x : 0
//   gelu: ((erf(x * c) + 1) * x) * 0.5, c = float(1/sqrt 2), in that order
//   identity: x
template <class T>
void activation_forward(T* out, const T* inp, int64_t n, Activation act,
                        const ActivationConstants<T>& k, T& s) {
  using std::erf;
  using std::tanh;
  if constexpr (std::is_same_v<T, Tracked<DD>>) {
    if (act == Activation::tanh) {  // the values four at a time
      dd_lanes::tanh_forward(out, inp, n);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    switch (act) {
      case Activation::identity:
        out[i] = inp[i];
        break;
      case Activation::tanh:
        out[i] = tanh(inp[i]);
        break;
      case Activation::relu:
        out[i] = branch_positive(inp[i], inp[i], k.zero);
        break;
      case Activation::gelu:
        s = inp[i];
        s *= k.inv_sqrt2;
        s = erf(s);
        s += k.one;
        s *= inp[i];
        s *= k.half;
        out[i] = s;
        break;
    }
  }
}

// dinp = dout * act'(inp), elementwise                  (SETS)
//   tanh: dout * (1 - y*y) from the output y (PyTorch's tanh_backward)
//   relu: x > 0 ? dout : 0 on the pre-activation x
//   gelu: dout * ((erf(x*c) + 1) * 0.5 + x * (exp(-(x*x) * 0.5) * k)),
//         c = float(1/sqrt 2), k = float(1/sqrt(2 pi)), in that order
//   identity: dout
template <class T>
void activation_backward(T* dinp, const T* dout, const T* inp, const T* out,
                         int64_t n, Activation act,
                         const ActivationConstants<T>& k, T& s, T& t) {
  using std::erf;
  using std::exp;
  for (int64_t i = 0; i < n; ++i) {
    switch (act) {
      case Activation::identity:
        dinp[i] = dout[i];
        break;
      case Activation::tanh:
        s = out[i];
        s *= out[i];
        s = k.one - s;
        s *= dout[i];
        dinp[i] = s;
        break;
      case Activation::relu:
        dinp[i] = branch_positive(inp[i], dout[i], k.zero);
        break;
      case Activation::gelu:
        t = inp[i];
        t *= inp[i];
        t *= k.half;
        t = -t;
        t = exp(t);
        t *= k.inv_sqrt_2pi;
        t *= inp[i];  // x * pdf(x)
        s = inp[i];
        s *= k.inv_sqrt2;
        s = erf(s);
        s += k.one;
        s *= k.half;  // cdf(x)
        s += t;
        s *= dout[i];
        dinp[i] = s;
        break;
    }
  }
}

// loss[b] = (sum_j (y - t)^2) / d  (one reduction, one division); diff is
// [d] scratch.                                          (SETS)
template <class T>
void mse_loss_forward(T* loss, T* diff, const T* y, const T* target, int64_t B,
                      int64_t d) {
  const T dd = T(d);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < d; ++j) {
      diff[j] = y[b * d + j];
      diff[j] -= target[b * d + j];
    }
    dot_into(loss[b], static_cast<const T*>(nullptr), d, diff, 1, diff, 1);
    loss[b] /= dd;
  }
}

// dy[b, j] = (y - t) * scale, scale = 2 num / (d * den)      (SETS)
// (scale: one float division; 2 num is formed as T(2) * T(num), the same
// value as T(2 * num) -- doubling is exact -- without overflowing int64
// when a loss scale has made num 2^62)
template <class T>
void mse_loss_backward(T* dy, const T* y, const T* target, int64_t B, int64_t d,
                       LossWeight w) {
  const T scale =
      trainer_loss_weight(T(2) * T(w.num) / (T(d) * T(w.den)), w.num);
  for (int64_t i = 0; i < B * d; ++i) {
    dy[i] = y[i];
    dy[i] -= target[i];
    dy[i] *= scale;
  }
}

// Per row b, m = max_j y[b, j] (any of the maxima):
//   probs[b, j] = exp(y - m) / s,  s = sum_j exp(y - m)   (one reduction)
//   loss[b]     = log(s) - (y[label] - m)                 (SETS both)
template <class T>
void cross_entropy_forward(T* loss, T* probs, const T* y, const int32_t* labels,
                           int64_t B, int64_t C, T& m, T& s, T& t) {
  using std::exp;
  using std::log;
  // Tracked<DD>: every row's exponentials at once, four lanes at a time
  // (dd_lanes::exp_forward; the same values as exp one by one).
  constexpr bool kLanes = std::is_same_v<T, Tracked<DD>>;
  if constexpr (kLanes) {
    for (int64_t b = 0; b < B; ++b) {
      const T* yb = &y[b * C];
      T* pb = &probs[b * C];
      max_into(m, C, yb, 1);
      for (int64_t j = 0; j < C; ++j) {
        pb[j] = yb[j];
        pb[j] -= m;
      }
    }
    dd_lanes::exp_forward(probs, probs, B * C);
  }
  for (int64_t b = 0; b < B; ++b) {
    const T* yb = &y[b * C];
    T* pb = &probs[b * C];
    max_into(m, C, yb, 1);
    if constexpr (!kLanes)
      for (int64_t j = 0; j < C; ++j) {
        t = yb[j];
        t -= m;
        pb[j] = exp(t);
      }
    sum_into(s, static_cast<const T*>(nullptr), C, pb, 1);
    for (int64_t j = 0; j < C; ++j) pb[j] /= s;
    t = yb[labels[b]];
    t -= m;
    loss[b] = log(s);
    loss[b] -= t;
  }
}

// dy[b, j] = (probs[b, j] - [j == label]) * w,  w = num / den   (SETS)
template <class T>
void cross_entropy_backward(T* dy, const T* probs, const int32_t* labels,
                            int64_t B, int64_t C, LossWeight weight) {
  const T w = trainer_loss_weight(T(weight.num) / T(weight.den), weight.num);
  const T one = T(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < C; ++j) {
      T& g = dy[b * C + j];
      g = probs[b * C + j];
      if (j == labels[b]) g -= one;
      g *= w;
    }
}

// -------------------------------------------------------- normalization
//
// BatchNorm1d, LayerNorm and GroupNorm share one formula over "groups"
// of E elements: element k of group g is x[g*gs + k*es] (NormGeometry,
// sim/layout.hpp).
//   BatchNorm1d (training mode): a group is a feature c over the B rows
//     of the micro-batch (G = C, E = B, gs = 1, es = C);
//   LayerNorm: a group is a row over its C features (G = B, E = C,
//     gs = C, es = 1);
//   GroupNorm(ng): a group is ng-th of a row, C/ng consecutive features
//     (G = B*ng, E = C/ng, gs = E, es = 1).
// The affine weight and bias are per feature in all three.

// Per group (in this order, as a float32 engine rounds):
//   mean = (sum_k x) / E;  d_k = x_k - mean;  ss = sum_k d_k^2
//   var = ss / E (biased);  rstd = 1 / sqrt(var + eps);  xh_k = d_k * rstd
//   running (BatchNorm, when rm != null):
//     rm = rm * (1 - m) + mean * m;  rv = rv * (1 - m) + (ss / (E-1)) * m
// then per element y[r, c] = xh[r, c] * gamma[c] + beta[c]     (SETS xh, y)
template <class T>
struct NormConstants {
  T eps = T(1e-5), momentum = T(0.1), one_minus_momentum, one = T(1);
  NormConstants() { one_minus_momentum = one - momentum; }
};

template <class T>
void norm_forward(T* y, T* xh, T* mean, T* rstd, T* rm, T* rv, const T* x,
                  const T* gamma, const T* beta, int64_t B, int64_t C,
                  const NormGeometry& geo, const NormConstants<T>& k, T& s,
                  T& t) {
  using std::sqrt;
  const int64_t G = geo.G, E = geo.E, gs = geo.gs, es = geo.es;
  for (int64_t g = 0; g < G; ++g) {
    const T* xg = x + g * gs;
    T* xhg = xh + g * gs;
    sum_into(mean[g], static_cast<const T*>(nullptr), E, xg, es);
    mean[g] /= T(E);
    for (int64_t e = 0; e < E; ++e) {
      xhg[e * es] = xg[e * es];
      xhg[e * es] -= mean[g];
    }
    dot_into(s, static_cast<const T*>(nullptr), E, xhg, es, xhg, es);
    t = s;
    t /= T(E);
    t += k.eps;
    t = sqrt(t);
    rstd[g] = k.one / t;
    for (int64_t e = 0; e < E; ++e) xhg[e * es] *= rstd[g];
    if (rm) {
      rm[g] *= k.one_minus_momentum;
      t = mean[g];
      t *= k.momentum;
      rm[g] += t;
      s /= T(E - 1);
      s *= k.momentum;
      rv[g] *= k.one_minus_momentum;
      rv[g] += s;
    }
  }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t c = 0; c < C; ++c) {
      T& o = y[r * C + c];
      o = xh[r * C + c];
      o *= gamma[c];
      o += beta[c];
    }
}

// Exact backward of norm_forward, dy the gradient wrt y:
//   dgamma[c] += sum_r dy[r, c] * xh[r, c];  dbeta[c] += sum_r dy[r, c]
//                                                      (ACCUMULATE, once)
//   per group: dxh_k = dy_k * gamma;  s1 = (sum_k dxh_k) / E;
//              s2 = (sum_k dxh_k * xh_k) / E
//   dx_k = ((dxh_k - s1) - xh_k * s2) * rstd                (SETS dx; dxh
//   is [B x C] scratch)
template <class T>
void norm_backward(T* dx, T* dxh, T* dgamma, T* dbeta, const T* dy, const T* xh,
                   const T* rstd, const T* gamma, int64_t B, int64_t C,
                   const NormGeometry& geo, T& s1, T& s2, T& t) {
  for (int64_t c = 0; c < C; ++c) {
    dot_into(dgamma[c], &dgamma[c], B, &dy[c], C, &xh[c], C);
    sum_into(dbeta[c], &dbeta[c], B, &dy[c], C);
  }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t c = 0; c < C; ++c) {
      dxh[r * C + c] = dy[r * C + c];
      dxh[r * C + c] *= gamma[c];
    }
  const int64_t G = geo.G, E = geo.E, gs = geo.gs, es = geo.es;
  for (int64_t g = 0; g < G; ++g) {
    const T* dg = dxh + g * gs;
    const T* xg = xh + g * gs;
    sum_into(s1, static_cast<const T*>(nullptr), E, dg, es);
    s1 /= T(E);
    dot_into(s2, static_cast<const T*>(nullptr), E, dg, es, xg, es);
    s2 /= T(E);
    for (int64_t e = 0; e < E; ++e) {
      t = xg[e * es];
      t *= s2;
      T& o = dx[g * gs + e * es];
      o = dg[e * es];
      o -= s1;
      o -= t;
      o *= rstd[g];
    }
  }
}

// ------------------------------------------------------------ optimizers

// Scalars of one SGD step as a float32 engine holds them.
template <class T>
struct SgdScalars {
  T lr, momentum, weight_decay;
  bool use_momentum = false, use_weight_decay = false;
  bool init_buffer = false;  // the first step: buf = g (dampening 0)
};

// PyTorch 1.13 single-tensor SGD, per element:
//   g = grad + wd * p                  (if wd != 0)
//   buf = init ? g : buf * momentum + g; g = buf   (if momentum != 0)
//   p = p - lr * g                     (UPDATES p, buf in place)
template <class T>
void sgd_step(int64_t n, T* p, const T* grad, T* buf, const SgdScalars<T>& s,
              T& g, T& tmp) {
  for (int64_t i = 0; i < n; ++i) {
    g = grad[i];
    if (s.use_weight_decay) {
      tmp = p[i];
      tmp *= s.weight_decay;
      g += tmp;
    }
    if (s.use_momentum) {
      if (s.init_buffer) {
        buf[i] = g;
      } else {
        buf[i] *= s.momentum;
        buf[i] += g;
      }
      g = buf[i];
    }
    tmp = g;
    tmp *= s.lr;
    p[i] -= tmp;
  }
}

// Scalars of one Adam/AdamW step as a float32 engine holds them.
template <class T>
struct AdamScalars {
  T beta1, beta2;
  T one_minus_beta1, one_minus_beta2;  // 1 - beta in float (exact there)
  T step_size;                         // host: lr / (1 - beta1^t), rounded once
  T bc2_sqrt;                          // host: sqrt(1 - beta2^t), rounded once
  T eps, weight_decay;
  T decay{};  // AdamW, host: 1 - lr * wd, rounded once
  bool coupled = false, decoupled = false;
};

namespace layers_detail {
// adam_step's loop (below).
template <class T>
ACCUMCHECK_DD_INLINE void adam_loop(int64_t n, T* p, const T* grad, T* m, T* v,
                                    const AdamScalars<T>& s, T& g, T& tmp) {
  using std::sqrt;
  for (int64_t i = 0; i < n; ++i) {
    if (s.decoupled) p[i] *= s.decay;
    g = grad[i];
    if (s.coupled) {
      tmp = p[i];
      tmp *= s.weight_decay;
      g += tmp;
    }
    m[i] *= s.beta1;
    tmp = g;
    tmp *= s.one_minus_beta1;
    m[i] += tmp;
    v[i] *= s.beta2;
    tmp = g;
    tmp *= g;
    tmp *= s.one_minus_beta2;
    v[i] += tmp;
    tmp = sqrt(v[i]);
    tmp /= s.bc2_sqrt;
    tmp += s.eps;
    g = m[i];
    g /= tmp;
    g *= s.step_size;
    p[i] -= g;
  }
}

}  // namespace layers_detail

// PyTorch 1.13 single-tensor Adam / AdamW, per element:
//   p = p * decay                              (AdamW)
//   g = grad + wd * p                          (Adam, if wd != 0)
//   m = m * beta1 + g * (1 - beta1)
//   v = v * beta2 + (g * g) * (1 - beta2)
//   denom = sqrt(v) / bc2_sqrt + eps
//   p = p - step_size * (m / denom)            (UPDATES p, m, v in place)
// `g` and `tmp` are the caller's scratch (no allocation per element for a
// multiprecision T); a trivially copyable T (Tracked<DD>, float) works on
// local copies of them and of the scalars instead, which the compiler
// keeps in registers: through references they may alias p, m and v, and
// every operation was stored and loaded again.  The same operations in
// the same order either way.
template <class T>
void adam_step(int64_t n, T* p, const T* grad, T* m, T* v,
               const AdamScalars<T>& s, T& g, T& tmp) {
  if constexpr (std::is_same_v<T, Tracked<DD>>) {
    // Four elements at a time (bit for bit).
    dd_lanes::adam_step(n, p, grad, m, v, s, g, tmp);
  } else if constexpr (std::is_same_v<T, double>) {
    // Four elements at a time (bit for bit; g and tmp are not used).
    dd_lanes::adam_step(n, p, grad, m, v, s);
  } else if constexpr (std::is_trivially_copyable_v<T>) {
    const AdamScalars<T> sc = s;
    T gl = g, tl = tmp;
    layers_detail::adam_loop(n, p, grad, m, v, sc, gl, tl);
    g = gl;
    tmp = tl;
  } else {
    layers_detail::adam_loop(n, p, grad, m, v, s, g, tmp);
  }
}

}  // namespace accumcheck
