// Oracle<T>: the high-precision CPU engine (sim/engine.hpp's contract).
//
// Plain loops over flat arrays, exact data in (float32 inputs convert
// exactly), each layer's forward and backward written side by side
// (llm.c style) under the names the device engine's kernels use:
// linear_forward/backward, activation_forward/backward,
// mse_loss_forward/backward, cross_entropy_forward/backward, sgd_step,
// adam_step.  Every dot product and sum goes through dot_into / sum_into
// (oracle/real.hpp), never a chain of +.
//
// T = OracleReal: the oracle (50 digits by default, set_oracle_digits).
// T = Tracked<OracleReal>: the same code also yields, per element, a bound
//     on what a float32 engine computing each formula below with the same
//     roundings (or fewer, e.g. FMA) can be off by (oracle/tracked.hpp).
//     The formulas are therefore part of the device contract; each says in
//     which order a float32 engine rounds.
// T = float: a naive float32 engine (tests use it against the bound).
//
// Batched like the device: a micro-batch of B items is a [B x width]
// matrix per layer; weight gradients are one reduction over the batch
// accumulated into .grad (GEMM with beta = 1).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "oracle/real.hpp"
#include "oracle/tracked.hpp"
#include "sim/data.hpp"
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
  for (int64_t b = 0; b < B; ++b)
    for (int64_t o = 0; o < out_dim; ++o)
      dot_into(out[b * out_dim + o], &bias[o], in, &W[o * in], 1, &inp[b * in],
               1);
}

// dinp[b, i]  = sum_o dout[b, o] W[o, i]                (SETS; skipped if null)
// dW[o, i]   += sum_b dout[b, o] inp[b, i]              (ACCUMULATES)
// dbias[o]   += sum_b dout[b, o]                        (ACCUMULATES)
// Each accumulation is one reduction whose initial value is the old grad.
template <class T>
void linear_backward(T* dinp, T* dW, T* dbias, const T* dout, const T* inp,
                     const T* W, int64_t B, int64_t in, int64_t out_dim) {
  if (dinp)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < in; ++i)
        dot_into(dinp[b * in + i], static_cast<const T*>(nullptr), out_dim,
                 &dout[b * out_dim], 1, &W[i], in);
  for (int64_t o = 0; o < out_dim; ++o) {
    for (int64_t i = 0; i < in; ++i)
      dot_into(dW[o * in + i], &dW[o * in + i], B, &dout[o], out_dim, &inp[i],
               in);
    sum_into(dbias[o], &dbias[o], B, &dout[o], out_dim);
  }
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

// dy[b, j] = (y - t) * scale, scale = 2 / (d * den)      (SETS)
// (scale: one float division of exact integers)
template <class T>
void mse_loss_backward(T* dy, const T* y, const T* target, int64_t B, int64_t d,
                       int64_t den) {
  const T scale = trainer_loss_weight(T(2) / (T(d) * T(den)));
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
  for (int64_t b = 0; b < B; ++b) {
    const T* yb = &y[b * C];
    T* pb = &probs[b * C];
    max_into(m, C, yb, 1);
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

// dy[b, j] = (probs[b, j] - [j == label]) * w,  w = 1 / den   (SETS)
template <class T>
void cross_entropy_backward(T* dy, const T* probs, const int32_t* labels,
                            int64_t B, int64_t C, int64_t den) {
  const T w = trainer_loss_weight(T(1) / T(den));
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
// BatchNorm1d and LayerNorm share one formula over "groups" of E
// elements: element k of group g is x[g*gs + k*es].
//   BatchNorm1d (training mode): a group is a feature c over the B rows
//     of the micro-batch (G = C, E = B, gs = 1, es = C);
//   LayerNorm: a group is a row over its C features (G = B, E = C,
//     gs = C, es = 1).
// The affine weight and bias are per feature in both.

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
                  bool batch, const NormConstants<T>& k, T& s, T& t) {
  using std::sqrt;
  const int64_t G = batch ? C : B, E = batch ? B : C;
  const int64_t gs = batch ? 1 : C, es = batch ? C : 1;
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
                   bool batch, T& s1, T& s2, T& t) {
  for (int64_t c = 0; c < C; ++c) {
    dot_into(dgamma[c], &dgamma[c], B, &dy[c], C, &xh[c], C);
    sum_into(dbeta[c], &dbeta[c], B, &dy[c], C);
  }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t c = 0; c < C; ++c) {
      dxh[r * C + c] = dy[r * C + c];
      dxh[r * C + c] *= gamma[c];
    }
  const int64_t G = batch ? C : B, E = batch ? B : C;
  const int64_t gs = batch ? 1 : C, es = batch ? C : 1;
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
  T decay;  // AdamW, host: 1 - lr * wd, rounded once
  bool coupled = false, decoupled = false;
};

// PyTorch 1.13 single-tensor Adam / AdamW, per element:
//   p = p * decay                              (AdamW)
//   g = grad + wd * p                          (Adam, if wd != 0)
//   m = m * beta1 + g * (1 - beta1)
//   v = v * beta2 + (g * g) * (1 - beta2)
//   denom = sqrt(v) / bc2_sqrt + eps
//   p = p - step_size * (m / denom)            (UPDATES p, m, v in place)
template <class T>
void adam_step(int64_t n, T* p, const T* grad, T* m, T* v,
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

// ---------------------------------------------------------------- engine

template <class T>
class Oracle {
 public:
  using Real = T;

  // Copies the dataset; throws std::invalid_argument when the model, the
  // data and the parameters do not fit together.
  Oracle(const ModelSpec& model, const Dataset& data,
         const std::vector<float>& initial_params);

  void zero_grad();
  int64_t items(const std::vector<int64_t>& ids) const;
  T forward_backward(const std::vector<int64_t>& ids, int64_t weight_den);
  void add_l2(double lambda, int64_t den);
  T grad_norm() const;
  void scale_grads(const T& f);
  void optimizer_step(const OptimizerSpec& opt, double lr);
  EngineState<T> state() const;
  void set_state(const EngineState<T>& s);
  // Dropout masks are keyed by (seed, epoch, sample id, layer, unit).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }

  // Beyond the contract.
  // sum_{i in ids} l_i, forward only (finite differences, certify); in
  // training mode (batch statistics, the current epoch's dropout masks)
  // but the running statistics are left alone.
  T loss(const std::vector<int64_t>& ids);
  const ParamLayout& layout() const { return layout_; }
  const ModelSpec& model() const { return model_; }
  std::vector<T>& params() { return params_; }
  const std::vector<T>& grads() const { return grads_; }
  const std::vector<T>& buffers() const { return buffers_; }

 private:
  void check_ids(const std::vector<int64_t>& ids) const;
  // Returns the rows of the pass: samples, or loss-bearing tokens.
  int64_t forward(const std::vector<int64_t>& ids, bool update_running);
  void ensure_capacity(int64_t rows);
  T loss_sum(int64_t B);
  bool has_norm() const { return model_.norm != NormKind::none; }
  bool batch_norm() const { return model_.norm == NormKind::batchnorm; }
  bool has_dropout() const { return model_.dropout > 0; }
  T* param(const TensorView& v) { return &params_[size_t(v.offset)]; }
  T* grad(const TensorView& v) { return &grads_[size_t(v.offset)]; }

  ModelSpec model_;
  ParamLayout layout_;
  Dataset data_;
  std::vector<T> params_, grads_, exp_avg_, exp_avg_sq_, buffers_;
  int64_t steps_ = 0;
  int64_t epoch_ = 0;
  ActivationConstants<T> k_;
  NormConstants<T> nk_;
  T dropout_scale_;  // float(1 / (1 - p)), the host's scalar rounded once

  // Work buffers, grown to the largest micro-batch seen (never shrunk).
  int64_t cap_ = 0;
  std::vector<std::vector<T>> z_;   // z_[l]: Linear outputs, l = 1..L
  std::vector<std::vector<T>> a_;   // a_[l]: layer l's input (a_[0] = x)
  std::vector<std::vector<T>> da_;  // gradient wrt a_[l]
  std::vector<std::vector<T>> dz_;  // gradient wrt z_[l]
  // Hidden layers with a norm: xh_ (normalized), y_ (affine output, the
  // activation's input), stats mean_/rstd_; with dropout: h_ (the
  // activation's output) and keep_ (the mask); dp_, dxh_ scratch.
  std::vector<std::vector<T>> xh_, y_, mean_, rstd_, h_;
  std::vector<std::vector<char>> keep_;
  std::vector<T> dp_, dxh_;
  std::vector<T> target_, probs_, losses_, diff_;
  std::vector<int32_t> labels_, rows_tok_;
  std::vector<int64_t> rows_id_;
  std::vector<T> scratch_;
  mutable T s0_, s1_, s2_;
};

// Lifts a float32 engine state into any oracle number type (exact).
template <class T>
EngineState<T> lift_state(const EngineState<float>& s) {
  auto lift = [](const std::vector<float>& x) {
    return std::vector<T>(x.begin(), x.end());
  };
  EngineState<T> r;
  r.params = lift(s.params);
  r.grads = lift(s.grads);
  r.exp_avg = lift(s.exp_avg);
  r.exp_avg_sq = lift(s.exp_avg_sq);
  r.optimizer_steps = s.optimizer_steps;
  r.buffers = lift(s.buffers);
  return r;
}

// ------------------------------------------------------- implementation

template <class T>
Oracle<T>::Oracle(const ModelSpec& model, const Dataset& data,
                  const std::vector<float>& initial_params)
    : model_(model), layout_(layout_of(model)), data_(data) {
  if (model.widths.size() < 2)
    throw std::invalid_argument("oracle: a model needs >= 2 widths");
  for (int64_t w : model.widths)
    if (w < 1) throw std::invalid_argument("oracle: widths must be >= 1");
  if (data.d_in != model.d_in() || data.d_out != model.d_out())
    throw std::invalid_argument("oracle: dataset shape does not fit the model");
  if (data.loss != model.loss)
    throw std::invalid_argument("oracle: dataset loss does not fit the model");
  if (model.kind == ModelKind::mlp &&
      int64_t(data.x.size()) != data.n * data.d_in)
    throw std::invalid_argument("oracle: dataset x has the wrong size");
  if (model.loss == LossKind::mse &&
      int64_t(data.y.size()) != data.n * data.d_out)
    throw std::invalid_argument("oracle: dataset y has the wrong size");
  if (model.loss == LossKind::cross_entropy && model.kind == ModelKind::mlp) {
    if (int64_t(data.label.size()) != data.n)
      throw std::invalid_argument("oracle: dataset labels have the wrong size");
    for (int32_t c : data.label)
      if (c < 0 || c >= data.d_out)
        throw std::invalid_argument("oracle: label out of range");
  }
  if (int64_t(initial_params.size()) != layout_.total)
    throw std::invalid_argument(
        "oracle: " + std::to_string(initial_params.size()) +
        " initial parameters, the model has " + std::to_string(layout_.total));
  if (model.kind == ModelKind::token &&
      (data.max_len < 1 ||
       int64_t(data.tokens.size()) != data.n * data.max_len ||
       int64_t(data.token_targets.size()) != data.n * data.max_len ||
       int64_t(data.length.size()) != data.n))
    throw std::invalid_argument("oracle: token dataset has the wrong shape");
  params_.assign(initial_params.begin(), initial_params.end());
  grads_.assign(size_t(layout_.total), T(0));
  const std::vector<float> b0 = initial_buffers(layout_);
  buffers_.assign(b0.begin(), b0.end());
  using H = typename Num<T>::Host;
  dropout_scale_ = Num<T>::from_host(
      H(H(1) / H(H(1) - H(has_dropout() ? model.dropout : 0.0))));
  const size_t L = layout_.layers();
  for (auto* v : {&z_, &a_, &da_, &dz_, &xh_, &y_, &mean_, &rstd_, &h_})
    v->resize(L + 1);
  keep_.resize(L + 1);
}

template <class T>
void Oracle<T>::zero_grad() {
  for (T& g : grads_) g = k_.zero;
}

template <class T>
void Oracle<T>::check_ids(const std::vector<int64_t>& ids) const {
  for (int64_t id : ids)
    if (id < 0 || id >= data_.n)
      throw std::out_of_range("oracle: sample id " + std::to_string(id) +
                              " outside the dataset of " +
                              std::to_string(data_.n));
}

template <class T>
int64_t Oracle<T>::items(const std::vector<int64_t>& ids) const {
  if (model_.kind != ModelKind::token) return int64_t(ids.size());
  check_ids(ids);
  int64_t n = 0;
  for (int64_t id : ids) n += data_.length[size_t(id)];
  return n;
}

template <class T>
void Oracle<T>::ensure_capacity(int64_t B) {
  if (B <= cap_) return;
  cap_ = B;
  const auto& w = model_.widths;
  const size_t L = layout_.layers();
  for (size_t l = 0; l <= L; ++l) {
    const size_t sz = size_t(B * w[l]);
    for (auto* v : {&z_, &a_, &da_, &dz_}) (*v)[l].resize(sz);
    if (l == 0 || l == L) continue;
    if (has_norm()) {
      xh_[l].resize(sz);
      y_[l].resize(sz);
      mean_[l].resize(size_t(batch_norm() ? w[l] : B));
      rstd_[l].resize(size_t(batch_norm() ? w[l] : B));
    }
    if (has_dropout()) {
      h_[l].resize(sz);
      keep_[l].resize(sz);
    }
  }
  int64_t maxw = 0;
  for (int64_t x : w) maxw = std::max(maxw, x);
  dp_.resize(size_t(B * maxw));
  dxh_.resize(size_t(B * maxw));
  target_.resize(size_t(B * w[L]));
  probs_.resize(size_t(B * w[L]));
  losses_.resize(size_t(B));
  labels_.resize(size_t(B));
  rows_tok_.resize(size_t(B));
  rows_id_.resize(size_t(B));
  scratch_.resize(size_t(B));
  diff_.resize(size_t(w[L]));
}

template <class T>
int64_t Oracle<T>::forward(const std::vector<int64_t>& ids,
                           bool update_running) {
  check_ids(ids);
  const auto& w = model_.widths;
  const size_t L = layout_.layers();
  if (model_.kind == ModelKind::token) {
    // Rows: the loss-bearing tokens of the sequences, in order (padding
    // has target ignore_index and contributes nothing).
    const int64_t B = items(ids);
    ensure_capacity(B);
    const int64_t D = w[0];
    const TensorView& Emb = layout_.tensors[size_t(layout_.embedding)];
    int64_t r = 0;
    for (int64_t id : ids)
      for (int64_t t = 0; t < data_.max_len; ++t) {
        const size_t at = size_t(id * data_.max_len + t);
        if (data_.token_targets[at] == Dataset::kIgnoreIndex) continue;
        const int32_t tok = data_.tokens[at];
        rows_tok_[size_t(r)] = tok;
        rows_id_[size_t(r)] = id;
        labels_[size_t(r)] = data_.token_targets[at];
        for (int64_t j = 0; j < D; ++j)
          a_[0][size_t(r * D + j)] = params_[size_t(Emb.offset + tok * D + j)];
        ++r;
      }
    linear_forward(z_[1].data(), a_[0].data(), param(layout_.weight(0)),
                   param(layout_.bias(0)), B, w[0], w[1]);
    return B;
  }
  const int64_t B = int64_t(ids.size());
  ensure_capacity(B);
  for (int64_t b = 0; b < B; ++b) {
    const float* x = data_.input(ids[size_t(b)]);
    for (int64_t i = 0; i < w[0]; ++i) a_[0][size_t(b * w[0] + i)] = T(x[i]);
    if (model_.loss == LossKind::mse) {
      const float* t = data_.target(ids[size_t(b)]);
      for (int64_t j = 0; j < w[L]; ++j)
        target_[size_t(b * w[L] + j)] = T(t[j]);
    } else {
      labels_[size_t(b)] = data_.label[size_t(ids[size_t(b)])];
    }
  }
  for (size_t l = 0; l < L; ++l) {
    linear_forward(z_[l + 1].data(), a_[l].data(), param(layout_.weight(l)),
                   param(layout_.bias(l)), B, w[l], w[l + 1]);
    if (l + 1 == L) break;
    const size_t h = l + 1;
    const int64_t C = w[h];
    const T* pre = z_[h].data();
    if (has_norm()) {
      T* rm = nullptr;
      T* rv = nullptr;
      if (batch_norm() && update_running) {
        rm = &buffers_[size_t(layout_.running_mean(l).offset)];
        rv = &buffers_[size_t(layout_.running_var(l).offset)];
      }
      norm_forward(y_[h].data(), xh_[h].data(), mean_[h].data(),
                   rstd_[h].data(), rm, rv, z_[h].data(),
                   param(layout_.norm_weight(l)), param(layout_.norm_bias(l)),
                   B, C, batch_norm(), nk_, s0_, s1_);
      pre = y_[h].data();
    }
    T* act_out = has_dropout() ? h_[h].data() : a_[h].data();
    activation_forward(act_out, pre, B * C, model_.activation, k_, s0_);
    if (has_dropout()) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t(b * C + c);
          const bool kept = dropout_keep(data_.seed, epoch_, ids[size_t(b)],
                                         int64_t(l), c, model_.dropout);
          keep_[h][i] = kept;
          if (kept) {
            a_[h][i] = act_out[i];
            a_[h][i] *= dropout_scale_;
          } else {
            a_[h][i] = k_.zero;
          }
        }
    }
  }
  return B;
}

template <class T>
T Oracle<T>::loss_sum(int64_t B) {
  const size_t L = layout_.layers();
  const int64_t d = model_.widths[L];
  if (model_.loss == LossKind::mse)
    mse_loss_forward(losses_.data(), diff_.data(), z_[L].data(), target_.data(),
                     B, d);
  else
    cross_entropy_forward(losses_.data(), probs_.data(), z_[L].data(),
                          labels_.data(), B, d, s0_, s1_, s2_);
  T total;
  sum_into(total, static_cast<const T*>(nullptr), B, losses_.data(), 1);
  return total;
}

template <class T>
T Oracle<T>::loss(const std::vector<int64_t>& ids) {
  if (ids.empty()) return T(0);
  return loss_sum(forward(ids, false));
}

template <class T>
T Oracle<T>::forward_backward(const std::vector<int64_t>& ids,
                              int64_t weight_den) {
  if (weight_den < 1)
    throw std::invalid_argument("oracle: weight_den must be >= 1");
  if (ids.empty()) return T(0);
  const int64_t B = forward(ids, true);
  const auto& w = model_.widths;
  const size_t L = layout_.layers();
  T total = loss_sum(B);
  if (model_.loss == LossKind::mse)
    mse_loss_backward(dz_[L].data(), z_[L].data(), target_.data(), B, w[L],
                      weight_den);
  else
    cross_entropy_backward(dz_[L].data(), probs_.data(), labels_.data(), B,
                           w[L], weight_den);
  const bool token = model_.kind == ModelKind::token;
  for (size_t l = L; l-- > 0;) {
    linear_backward(l > 0 || token ? da_[l].data() : nullptr,
                    grad(layout_.weight(l)), grad(layout_.bias(l)),
                    dz_[l + 1].data(), a_[l].data(), param(layout_.weight(l)),
                    B, w[l], w[l + 1]);
    if (l == 0) break;
    const int64_t C = w[l];
    // da_[l] -> (dropout) -> d(activation output) -> d(pre) -> dz_[l].
    const T* dact = da_[l].data();
    if (has_dropout()) {
      for (int64_t i = 0; i < B * C; ++i) {
        if (keep_[l][size_t(i)]) {
          dp_[size_t(i)] = da_[l][size_t(i)];
          dp_[size_t(i)] *= dropout_scale_;
        } else {
          dp_[size_t(i)] = k_.zero;
        }
      }
      dact = dp_.data();
    }
    const T* pre = has_norm() ? y_[l].data() : z_[l].data();
    const T* act_out = has_dropout() ? h_[l].data() : a_[l].data();
    T* dpre = has_norm() ? dxh_.data() : dz_[l].data();
    // dact may alias dp_: activation_backward reads element i before
    // writing element i only.
    activation_backward(dpre, dact, pre, act_out, B * C, model_.activation, k_,
                        s0_, s1_);
    if (has_norm()) {
      // dpre lives in dxh_; copy it aside so norm_backward can reuse dxh_.
      for (int64_t i = 0; i < B * C; ++i) dp_[size_t(i)] = dxh_[size_t(i)];
      norm_backward(dz_[l].data(), dxh_.data(),
                    grad(layout_.norm_weight(l - 1)),
                    grad(layout_.norm_bias(l - 1)), dp_.data(), xh_[l].data(),
                    rstd_[l].data(), param(layout_.norm_weight(l - 1)), B, C,
                    batch_norm(), s0_, s1_, s2_);
    }
  }
  if (token) {
    // Embedding: dE[v, j] += sum over rows r with token v of da_0[r, j],
    // in row order, added once (no scatter, no atomics).
    const int64_t D = w[0], V = layout_.tensors[size_t(layout_.embedding)].rows;
    T* dE = grad(layout_.tensors[size_t(layout_.embedding)]);
    for (int64_t v = 0; v < V; ++v) {
      int64_t m = 0;
      for (int64_t j = 0; j < D; ++j) {
        m = 0;
        for (int64_t r = 0; r < B; ++r)
          if (rows_tok_[size_t(r)] == v)
            scratch_[size_t(m++)] = da_[0][size_t(r * D + j)];
        if (m == 0) break;
        sum_into(dE[v * D + j], &dE[v * D + j], m, scratch_.data(), 1);
      }
    }
  }
  return total;
}

// grads += c * params, c = lambda / den computed by the host, rounded once.
template <class T>
void Oracle<T>::add_l2(double lambda, int64_t den) {
  using H = typename Num<T>::Host;
  if (den < 1) throw std::invalid_argument("oracle: add_l2 den must be >= 1");
  const T c = Num<T>::from_host(H(H(lambda) / H(double(den))));
  for (size_t i = 0; i < grads_.size(); ++i) {
    s0_ = params_[i];
    s0_ *= c;
    grads_[i] += s0_;
  }
}

// sqrt(sum g^2): one reduction over every tensor, then one sqrt.
template <class T>
T Oracle<T>::grad_norm() const {
  using std::sqrt;
  dot_into(s0_, static_cast<const T*>(nullptr), int64_t(grads_.size()),
           grads_.data(), 1, grads_.data(), 1);
  return T(sqrt(s0_));
}

template <class T>
void Oracle<T>::scale_grads(const T& f) {
  for (T& g : grads_) g *= f;
}

template <class T>
void Oracle<T>::optimizer_step(const OptimizerSpec& opt, double lr) {
  using H = typename Num<T>::Host;
  using std::pow;
  using std::sqrt;
  ++steps_;
  const int64_t n = int64_t(params_.size());
  if (opt.kind == OptimizerKind::sgd) {
    SgdScalars<T> s;
    s.lr = T(lr);
    s.momentum = T(opt.momentum);
    s.weight_decay = T(opt.weight_decay);
    s.use_momentum = opt.momentum != 0.0;
    s.use_weight_decay = opt.weight_decay != 0.0;
    if (s.use_momentum && exp_avg_.empty()) {
      exp_avg_.assign(size_t(n), T(0));
      s.init_buffer = true;
    }
    if (s.use_momentum && steps_ == 1) s.init_buffer = true;
    sgd_step(n, params_.data(), grads_.data(), exp_avg_.data(), s, s0_, s1_);
    return;
  }
  AdamScalars<T> s;
  s.beta1 = T(opt.beta1);
  s.beta2 = T(opt.beta2);
  s.one_minus_beta1 = T(1) - s.beta1;
  s.one_minus_beta2 = T(1) - s.beta2;
  const H t = H(double(steps_));
  const H bc1 = H(H(1) - pow(H(opt.beta1), t));
  const H bc2 = H(H(1) - pow(H(opt.beta2), t));
  s.step_size = Num<T>::from_host(H(H(lr) / bc1));
  s.bc2_sqrt = Num<T>::from_host(H(sqrt(bc2)));
  s.eps = T(opt.eps);
  s.weight_decay = T(opt.weight_decay);
  if (opt.kind == OptimizerKind::adamw) {
    s.decoupled = opt.weight_decay != 0.0;
    s.decay = Num<T>::from_host(H(H(1) - H(lr) * H(opt.weight_decay)));
  } else {
    s.coupled = opt.weight_decay != 0.0;
  }
  if (exp_avg_.empty()) exp_avg_.assign(size_t(n), T(0));
  if (exp_avg_sq_.empty()) exp_avg_sq_.assign(size_t(n), T(0));
  adam_step(n, params_.data(), grads_.data(), exp_avg_.data(),
            exp_avg_sq_.data(), s, s0_, s1_);
}

template <class T>
EngineState<T> Oracle<T>::state() const {
  EngineState<T> s;
  s.params = params_;
  s.grads = grads_;
  s.exp_avg = exp_avg_;
  s.exp_avg_sq = exp_avg_sq_;
  s.optimizer_steps = steps_;
  s.buffers = buffers_;
  return s;
}

template <class T>
void Oracle<T>::set_state(const EngineState<T>& s) {
  const size_t n = size_t(layout_.total);
  auto fits = [n](const std::vector<T>& v, bool may_be_empty) {
    return v.size() == n || (may_be_empty && v.empty());
  };
  if (!fits(s.params, false) || !fits(s.grads, false) ||
      !fits(s.exp_avg, true) || !fits(s.exp_avg_sq, true) ||
      s.optimizer_steps < 0 ||
      !(s.buffers.empty() || int64_t(s.buffers.size()) == layout_.buffer_total))
    throw std::invalid_argument(
        "oracle: set_state: a tensor does not have the model's " +
        std::to_string(n) + " elements, or steps < 0");
  params_ = s.params;
  grads_ = s.grads;
  exp_avg_ = s.exp_avg;
  exp_avg_sq_ = s.exp_avg_sq;
  steps_ = s.optimizer_steps;
  // Empty buffers (a state saved without them): keep the current ones.
  if (!s.buffers.empty()) buffers_ = s.buffers;
}

extern template class Oracle<OracleReal>;
extern template class Oracle<Tracked<OracleReal>>;

}  // namespace accumcheck
