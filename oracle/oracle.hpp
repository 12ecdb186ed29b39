// Oracle<T>: the high-precision CPU engine (sim/engine.hpp's contract).
//
// Plain loops over flat arrays, exact data in (float32 inputs convert
// exactly); each layer's forward and backward (oracle/layers.hpp) written
// side by side (llm.c style) under the names the device engine's kernels use:
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
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "oracle/layers.hpp"
#include "oracle/real.hpp"
#include "oracle/tracked.hpp"
#include "sim/data.hpp"
#include "sim/engine.hpp"
#include "sim/layout.hpp"
#include "sim/rng.hpp"
#include "sim/scenario.hpp"
#include "sim/trainer.hpp"

namespace accumcheck {

// ---------------------------------------------------------------- engine

namespace oracle_detail {

// A low-precision gradient buffer's format: significant bits, the
// smallest normal exponent, the largest finite value (bf16: (2 - 2^-7)
// 2^127).
struct BufferFormat {
  int p, emin;
  double big;
};
inline BufferFormat buffer_format(GradBuffer b) {
  return b == GradBuffer::bf16 ? BufferFormat{8, -126, 0x1.fep127}
                               : BufferFormat{11, -14, 65504.0};
}

// round_to_buffer by its definition (frexp, floor, the tie's parity), for
// every plain number type: the reference that round_to_buffer's double
// path is tested against (tests/precision_test.cpp).
template <class T>
T round_to_buffer_exact(const T& x, GradBuffer b) {
  using std::abs, std::floor, std::frexp, std::ldexp;
  if (b == GradBuffer::fp32 || x == T(0) || x != x) return x;
  const auto [p, emin, big_d] = buffer_format(b);
  const T big = T(big_d);
  const T inf = T(std::numeric_limits<double>::infinity());
  if (abs(x) > T(std::numeric_limits<double>::max()))
    return x > T(0) ? inf : -inf;
  int e = 0;
  (void)frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int qe = std::max(e - 1, emin) - (p - 1);
  const T y = ldexp(x, -qe);
  T f = floor(y);
  const T d = y - f;
  const bool odd = f - T(2) * floor(f / T(2)) != T(0);
  if (d > T(0.5) || (d == T(0.5) && odd)) f += T(1);
  const T r = ldexp(f, qe);
  if (abs(r) > big) return r > T(0) ? inf : -inf;
  return r;
}

}  // namespace oracle_detail

// x rounded to the gradient buffer's format (sim/scenario.hpp
// GradBuffer) exactly: round to nearest, ties to even, at 8 (bf16) or 11
// (fp16) significant bits, fp16's subnormal quantum 2^-24, beyond the
// largest finite value (bf16 (2 - 2^-7) 2^127, fp16 65504) +-inf.  For
// plain number types (double, OracleReal).
//
// A Tracked value (v, e) is rounded as an interval: the engine's value
// before the rounding lies in [v - e, v + e] and rounding is monotone, so
// after it the engine holds a value in [rnd(v - e), rnd(v + e)].  The
// result is (r, max(rnd(v + e) - r, r - rnd(v - e))) with r = rnd(v):
// rigorous, and as tight as the format allows (e = 0 wherever the whole
// interval rounds to one value, which is nearly everywhere, as e is some
// float32 ulps and the format's quantum 2^13 or 2^16 of them).  The
// endpoints are taken to double outward (one double ulp beyond the
// nearest double, which covers the conversion's rounding) and rounded by
// the exact double branch.
template <class T>
T round_to_buffer(const T& x, GradBuffer b) {
  if constexpr (requires { x.e; }) {
    using V = decltype(x.v);
    if (b == GradBuffer::fp32) return x;
    const double inf = std::numeric_limits<double>::infinity();
    const double lo = std::nextafter(static_cast<double>(V(x.v - x.e)), -inf);
    const double hi = std::nextafter(static_cast<double>(V(x.v + x.e)), inf);
    const double r = round_to_buffer(static_cast<double>(x.v), b);
    const double rl = round_to_buffer(lo, b), rh = round_to_buffer(hi, b);
    if (!std::isfinite(rl) || !std::isfinite(rh) || !std::isfinite(r))
      return T(V(r), V(inf));
    return T(V(r), V(std::max(rh - r, r - rl)));
  } else if constexpr (std::is_same_v<T, double>) {
    // A normal double below 2^960 (else the definition's way): x + c - c
    // with c = 1.5 2^(qe + 52) is x rounded to a multiple of 2^qe, ties
    // to even, in the default rounding mode: |x| < 2^(qe + p), so x + c
    // lies in c's binade, whose ulp is 2^qe and in which c's last bit is
    // 0; the subtraction is exact.  The same bits as round_to_buffer_exact
    // (PrecisionRounding.DoublePathEqualsTheDefinition) without its frexp,
    // two ldexp and two floor: the cheap ranking's candidates with a
    // low-precision buffer round every gradient element this way.
    const uint64_t bits = std::bit_cast<uint64_t>(x);
    const int field = int((bits >> 52) & 0x7ff);
    if (b == GradBuffer::fp32 || field == 0 || field >= 1023 + 960)
      return oracle_detail::round_to_buffer_exact(x, b);
    const auto [p, emin, big] = oracle_detail::buffer_format(b);
    const int qe = std::max(field - 1023, emin) - (p - 1);
    const double c = std::bit_cast<double>(uint64_t(qe + 52 + 1023) << 52 |
                                           uint64_t{1} << 51);
    const double r = (x + c) - c;
    if (std::fabs(r) > big)
      return r > 0 ? std::numeric_limits<double>::infinity()
                   : -std::numeric_limits<double>::infinity();
    return r;
  } else {
    return oracle_detail::round_to_buffer_exact(x, b);
  }
}

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
  T forward_backward(const std::vector<int64_t>& ids, LossWeight weight) {
    return rounded([&] { return forward_backward_exact(ids, weight); });
  }
  void add_l2(double lambda, int64_t den) {
    rounded([&] {
      add_l2_exact(lambda, den);
      return T(0);
    });
  }
  // The gradient buffer's format (sim/scenario.hpp GradBuffer; the
  // trainer sets it): bf16/fp16 round every accumulation,
  // grad = rnd(grad + rnd(fresh)), and every scaling of the buffer, each
  // rounding applied once to the exact value (round_to_buffer).
  void set_grad_buffer(GradBuffer b) { buffer_ = b; }
  // No inf or NaN in the gradient (GradScaler's found_inf), by value.
  bool grads_finite() const {
    for (const T& g : grads_) {
      if constexpr (requires { g.v; }) {
        if (!(g.v - g.v == decltype(g.v)(0))) return false;
      } else {
        if (!(g - g == T(0))) return false;
      }
    }
    return true;
  }
  T grad_norm() const;
  void scale_grads(const T& f);
  void optimizer_step(const OptimizerSpec& opt, double lr);
  EngineState<T> state() const;
  void set_state(const EngineState<T>& s);
  // set_state(s), `s` left holding state() (sim/engine.hpp ExposesTensors;
  // `s` from state(): its tensors are the model's sizes).
  void swap_state(EngineState<T>& s) {
    params_.swap(s.params);
    grads_.swap(s.grads);
    exp_avg_.swap(s.exp_avg);
    exp_avg_sq_.swap(s.exp_avg_sq);
    std::swap(steps_, s.optimizer_steps);
    buffers_.swap(s.buffers);
  }
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
  std::vector<T>& grads() { return grads_; }
  const std::vector<T>& buffers() const { return buffers_; }
  // The optimizer's state (empty before the first step that keeps it).
  const std::vector<T>& exp_avg() const { return exp_avg_; }
  const std::vector<T>& exp_avg_sq() const { return exp_avg_sq_; }
  // Adam's moments, sized to the parameters (zero where none were kept
  // yet), to be overwritten: certify's teacher forcing of the optimizer's
  // state (the trainer's recorded moments before a step).
  std::vector<T>& adam_moment(bool second) {
    std::vector<T>& m = second ? exp_avg_sq_ : exp_avg_;
    if (m.empty()) m.assign(params_.size(), T(0));
    return m;
  }
  // An optimizer step counted, not taken: certify's steps before a range
  // whose state is then forced (bias corrections count every step).
  void count_optimizer_step() { ++steps_; }

 private:
  T forward_backward_exact(const std::vector<int64_t>& ids, LossWeight weight);
  void add_l2_exact(double lambda, int64_t den);
  // Runs `f` into a zeroed buffer and adds its gradient with the buffer's
  // rounding (fp32: straight into the buffer, as before).
  template <class F>
  T rounded(F&& f) {
    if (buffer_ == GradBuffer::fp32) return f();
    std::vector<T> sum = grads_;
    for (T& g : grads_) g = T(0);
    const T r = f();
    for (size_t i = 0; i < grads_.size(); ++i)
      grads_[i] = round_to_buffer(
          T(sum[i] + round_to_buffer(grads_[i], buffer_)), buffer_);
    return r;
  }
  GradBuffer buffer_ = GradBuffer::fp32;
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
      const int64_t G = norm_geometry(model_, B, w[l]).G;
      mean_[l].resize(size_t(G));
      rstd_[l].resize(size_t(G));
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
                   B, C, norm_geometry(model_, B, C), nk_, s0_, s1_);
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
T Oracle<T>::forward_backward_exact(const std::vector<int64_t>& ids,
                                    LossWeight weight) {
  if (weight.den < 1 || weight.num < 1)
    throw std::invalid_argument("oracle: loss weight num/den must be >= 1");
  if (ids.empty()) return T(0);
  const int64_t B = forward(ids, true);
  const auto& w = model_.widths;
  const size_t L = layout_.layers();
  T total = loss_sum(B);
  if (model_.loss == LossKind::mse)
    mse_loss_backward(dz_[L].data(), z_[L].data(), target_.data(), B, w[L],
                      weight);
  else
    cross_entropy_backward(dz_[L].data(), probs_.data(), labels_.data(), B,
                           w[L], weight);
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
                    norm_geometry(model_, B, C), s0_, s1_, s2_);
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
void Oracle<T>::add_l2_exact(double lambda, int64_t den) {
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
  if (buffer_ != GradBuffer::fp32)
    for (T& g : grads_) g = round_to_buffer(g, buffer_);
}

// The scalars of Adam / AdamW's step number `step` (1 for the first), as
// a float32 engine holds them: optimizer_step's, and certify's replay of
// recorded moments.
template <class T>
AdamScalars<T> adam_scalars(const OptimizerSpec& opt, double lr, int64_t step) {
  using H = typename Num<T>::Host;
  using std::pow;
  using std::sqrt;
  AdamScalars<T> s;
  s.beta1 = T(opt.beta1);
  s.beta2 = T(opt.beta2);
  s.one_minus_beta1 = T(1) - s.beta1;
  s.one_minus_beta2 = T(1) - s.beta2;
  const H t = H(double(step));
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
  return s;
}

template <class T>
void Oracle<T>::optimizer_step(const OptimizerSpec& opt, double lr) {
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
  const AdamScalars<T> s = adam_scalars<T>(opt, lr, steps_);
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
extern template class Oracle<Tracked<BoundReal>>;
extern template class Oracle<Tracked<DD>>;
extern template class Oracle<double>;
// The trainer on the 50-digit oracle (plain and tracked) is compiled once,
// in oracle/oracle_trainer.cpp, not again in every unit that runs it
// (docs/development.md "Build": the cold build's CPU).
extern template class Trainer<Oracle<OracleReal>>;
extern template class Trainer<Oracle<Tracked<OracleReal>>>;

}  // namespace accumcheck
