// Member definitions of Device<Executor> (gpu/device.hpp).  Included only
// by the translation units that explicitly instantiate a Device: the
// emulated one (gpu/emulated.cpp) and the CUDA one (gpu/cuda/cuda.cu),
// so both run exactly the kernel bodies of gpu/kernels.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "sim/rng.hpp"

namespace accumcheck {

namespace device_detail {

inline kern::Act act_of(Activation a) {
  switch (a) {
    case Activation::identity:
      return kern::Act::identity;
    case Activation::tanh:
      return kern::Act::tanh;
    case Activation::relu:
      return kern::Act::relu;
    case Activation::gelu:
      return kern::Act::gelu;
  }
  return kern::Act::identity;
}

[[noreturn]] inline void bad(const std::string& what) {
  throw std::invalid_argument("Device: " + what);
}

}  // namespace device_detail

template <class Exec>
Device<Exec>::Device(const ModelSpec& spec, const Dataset& data,
                     const std::vector<float>& initial_params)
    : spec_(spec),
      layout_(layout_of(spec)),
      owned_(std::make_unique<Exec>()),
      ex_(owned_.get()) {
  init(data, initial_params);
}

template <class Exec>
Device<Exec>::Device(const ModelSpec& spec, const Dataset& data,
                     const std::vector<float>& initial_params, Exec& executor)
    : spec_(spec), layout_(layout_of(spec)), ex_(&executor) {
  init(data, initial_params);
}

template <class Exec>
void Device<Exec>::init(const Dataset& data,
                        const std::vector<float>& initial_params) {
  const ModelSpec& spec = spec_;
  using device_detail::bad;
  if (spec.widths.size() < 2) bad("a model needs at least {d_in, d_out}");
  for (int64_t w : spec.widths)
    if (w < 1) bad("layer widths must be positive");
  if (data.d_in != spec.d_in() || data.d_out != spec.d_out())
    bad("dataset is " + std::to_string(data.d_in) + " -> " +
        std::to_string(data.d_out) + ", model is " +
        std::to_string(spec.d_in()) + " -> " + std::to_string(spec.d_out()));
  if (data.loss != spec.loss) bad("dataset and model disagree on the loss");
  const bool token = spec.kind == ModelKind::token;
  if (!token && int64_t(data.x.size()) != data.n * data.d_in)
    bad("dataset x has " + std::to_string(data.x.size()) +
        " values, expected " + std::to_string(data.n * data.d_in));
  if (spec.loss == LossKind::mse &&
      int64_t(data.y.size()) != data.n * data.d_out)
    bad("dataset y has " + std::to_string(data.y.size()) +
        " values, expected " + std::to_string(data.n * data.d_out));
  if (token && (data.max_len < 1 ||
                int64_t(data.tokens.size()) != data.n * data.max_len ||
                int64_t(data.token_targets.size()) != data.n * data.max_len ||
                int64_t(data.length.size()) != data.n))
    bad("token dataset has the wrong shape");
  if (!token && spec.loss == LossKind::cross_entropy) {
    if (int64_t(data.label.size()) != data.n)
      bad("dataset has " + std::to_string(data.label.size()) +
          " labels, expected " + std::to_string(data.n));
    for (int32_t l : data.label)
      if (l < 0 || l >= data.d_out)
        bad("label " + std::to_string(l) + " outside [0, " +
            std::to_string(data.d_out) + ")");
  }
  if (int64_t(initial_params.size()) != layout_.total)
    bad("initial parameters have " + std::to_string(initial_params.size()) +
        " values, the model has " + std::to_string(layout_.total));

  n_samples_ = data.n;
  d_in_ = data.d_in;
  d_out_ = data.d_out;
  max_width_ = *std::max_element(spec.widths.begin(), spec.widths.end());
  Exec& ex = *ex_;
  const int64_t P = layout_.total;
  params_ = ex.template alloc<float>(P);
  grads_ = ex.template alloc<float>(P);
  exp_avg_ = ex.template alloc<float>(P);
  exp_avg_sq_ = ex.template alloc<float>(P);
  ex.upload(params_, initial_params.data(), P);
  data_x_ = ex.template alloc<float>(std::max<int64_t>(1, data.n * d_in_));
  if (!token) ex.upload(data_x_, data.x.data(), data.n * d_in_);
  seed_ = data.seed;
  max_len_ = data.max_len;
  tokens_ = data.tokens;
  token_targets_ = data.token_targets;
  length_ = data.length;
  {
    const std::vector<float> b0 = initial_buffers(layout_);
    buffers_ =
        ex.template alloc<float>(std::max<int64_t>(1, layout_.buffer_total));
    if (!b0.empty()) ex.upload(buffers_, b0.data(), int64_t(b0.size()));
  }
  if (token) {
  } else if (spec.loss == LossKind::mse) {
    data_y_ = ex.template alloc<float>(std::max<int64_t>(1, data.n * d_out_));
    ex.upload(data_y_, data.y.data(), data.n * d_out_);
  } else {
    data_label_ = ex.template alloc<int32_t>(std::max<int64_t>(1, data.n));
    ex.upload(data_label_, data.label.data(), data.n);
  }
  int64_t max_weight = 1;
  for (size_t l = 0; l < layout_.layers(); ++l)
    max_weight = std::max(max_weight, layout_.weight(l).size());
  wtmp_ = ex.template alloc<float>(max_weight);
  scalar_ = ex.template alloc<float>(2);
}

template <class Exec>
Device<Exec>::~Device() = default;

template <class Exec>
void Device<Exec>::ensure_capacity(int64_t rows) {
  if (rows <= cap_) return;
  Exec& ex = *ex_;
  const int64_t cap = std::max(rows, 2 * cap_);
  const size_t L = layout_.layers();
  ids_ = ex.template alloc<int64_t>(cap);
  a_.clear();
  z_.clear();
  for (size_t l = 0; l <= L; ++l) {
    a_.push_back(ex.template alloc<float>(cap * spec_.widths[l]));
    z_.push_back(ex.template alloc<float>(l == 0 ? 1 : cap * spec_.widths[l]));
  }
  xh_.clear();
  y_.clear();
  h_.clear();
  mean_.clear();
  rstd_.clear();
  keep_.clear();
  const bool norm = spec_.norm != NormKind::none, drop = spec_.dropout > 0;
  for (size_t l = 0; l <= L; ++l) {
    const bool hidden = l > 0 && l < L;
    const int64_t n = hidden ? cap * spec_.widths[l] : 1;
    const int64_t g = hidden ? norm_geometry(spec_, cap, spec_.widths[l]).G : 1;
    xh_.push_back(ex.template alloc<float>(norm ? n : 1));
    y_.push_back(ex.template alloc<float>(norm ? n : 1));
    mean_.push_back(ex.template alloc<float>(norm ? g : 1));
    rstd_.push_back(ex.template alloc<float>(norm ? g : 1));
    h_.push_back(ex.template alloc<float>(drop ? n : 1));
    keep_.push_back(ex.template alloc<int32_t>(drop ? n : 1));
  }
  dp_ = ex.template alloc<float>(cap * max_width_);
  dpre_ = ex.template alloc<float>(cap * max_width_);
  int64_t groups = 1;  // the most norm groups of any hidden layer
  for (size_t l = 1; l < L; ++l)
    groups = std::max(groups, norm_geometry(spec_, cap, spec_.widths[l]).G);
  s1_ = ex.template alloc<float>(groups);
  s2_ = ex.template alloc<float>(groups);
  target_ = ex.template alloc<float>(cap * d_out_);
  label_ = ex.template alloc<int32_t>(cap);
  da_ = ex.template alloc<float>(cap * max_width_);
  dz_ = ex.template alloc<float>(cap * max_width_);
  item_loss_ = ex.template alloc<float>(cap);
  row_max_ = ex.template alloc<float>(cap);
  row_sum_ = ex.template alloc<float>(cap);
  cap_ = cap;
}

template <class Exec>
int64_t Device<Exec>::items(const std::vector<int64_t>& ids) const {
  if (spec_.kind != ModelKind::token) return int64_t(ids.size());
  int64_t n = 0;
  for (int64_t id : ids) {
    if (id < 0 || id >= n_samples_)
      throw std::out_of_range("Device: sample id " + std::to_string(id) +
                              " outside [0, " + std::to_string(n_samples_) +
                              ")");
    n += length_[size_t(id)];
  }
  return n;
}

// Token models: the loss-bearing tokens of the sequences, in order, as
// rows: their embeddings gathered into a_[0], their targets into label_;
// ids_ holds each row's token id (for the embedding's backward).
template <class Exec>
int64_t Device<Exec>::gather_tokens(const std::vector<int64_t>& ids) {
  Exec& ex = *ex_;
  const int64_t rows = items(ids);
  ensure_capacity(rows);
  std::vector<int64_t> tok;
  std::vector<int32_t> tgt;
  tok.reserve(size_t(rows));
  tgt.reserve(size_t(rows));
  for (int64_t id : ids)
    for (int64_t t = 0; t < max_len_; ++t) {
      const size_t at = size_t(id * max_len_ + t);
      if (token_targets_[at] == Dataset::kIgnoreIndex) continue;
      tok.push_back(tokens_[at]);
      tgt.push_back(token_targets_[at]);
    }
  ex.upload(ids_, tok.data(), rows);
  ex.upload(label_, tgt.data(), rows);
  const TensorView& E = layout_.tensors[size_t(layout_.embedding)];
  ex.launch(rows * d_in_,
            kern::GatherRows<float>{params_.data() + E.offset, ids_.data(),
                                    a_[0].data(), d_in_});
  return rows;
}

// Gathers the rows, runs the forward pass and the per-item losses; returns
// the sum of the item losses in row order.  Leaves z_, a_ and the loss's
// row statistics for the backward.
template <class Exec>
float Device<Exec>::forward_and_loss(const std::vector<int64_t>& ids,
                                     bool update_running) {
  Exec& ex = *ex_;
  for (int64_t id : ids)
    if (id < 0 || id >= n_samples_)
      throw std::out_of_range("Device: sample id " + std::to_string(id) +
                              " outside [0, " + std::to_string(n_samples_) +
                              ")");
  const bool token = spec_.kind == ModelKind::token;
  int64_t b = int64_t(ids.size());
  if (token) {
    b = gather_tokens(ids);
  } else {
    ensure_capacity(b);
    ex.upload(ids_, ids.data(), b);
    ex.launch(b * d_in_, kern::GatherRows<float>{data_x_.data(), ids_.data(),
                                                 a_[0].data(), d_in_});
  }
  const size_t L = layout_.layers();
  const kern::Act act = device_detail::act_of(spec_.activation);
  const bool norm = spec_.norm != NormKind::none;
  const bool batch = spec_.norm == NormKind::batchnorm;
  const bool drop = spec_.dropout > 0;
  const float scale = float(1.0 / (1.0 - spec_.dropout));
  for (size_t l = 1; l <= L; ++l) {
    const TensorView& W = layout_.weight(l - 1);
    const TensorView& B = layout_.bias(l - 1);
    const int64_t in = spec_.widths[l - 1], out = spec_.widths[l];
    // z_l = a_{l-1} W_l^T
    ex.launch(b * out, kern::MatMul{.a = a_[l - 1].data(),
                                    .b = params_.data() + W.offset,
                                    .c = z_[l].data(),
                                    .m = b,
                                    .n = out,
                                    .k = in,
                                    .lda = in,
                                    .ldb = in,
                                    .ldc = out,
                                    .ta = false,
                                    .tb = true});
    const bool plain = l == L || (!norm && !drop);
    ex.launch(b * out,
              kern::BiasActivationForward{
                  z_[l].data(), params_.data() + B.offset, a_[l].data(), out,
                  l == L ? kern::Act::identity
                         : (plain ? act : kern::Act::identity)});
    if (plain) continue;
    const float* pre = z_[l].data();
    if (norm) {
      const NormGeometry geo = norm_geometry(spec_, b, out);
      float* rm = nullptr;
      float* rv = nullptr;
      if (batch && update_running) {
        rm = buffers_.data() + layout_.running_mean(l - 1).offset;
        rv = buffers_.data() + layout_.running_var(l - 1).offset;
      }
      ex.launch(geo.G, kern::NormStats{z_[l].data(), mean_[l].data(),
                                       rstd_[l].data(), rm, rv, geo.E, geo.gs,
                                       geo.es, float(1e-5), float(0.1)});
      ex.launch(b * out, kern::NormApply{
                             z_[l].data(), mean_[l].data(), rstd_[l].data(),
                             params_.data() + layout_.norm_weight(l - 1).offset,
                             params_.data() + layout_.norm_bias(l - 1).offset,
                             xh_[l].data(), y_[l].data(), out, geo.row_groups});
      pre = y_[l].data();
    }
    float* act_out = drop ? h_[l].data() : a_[l].data();
    ex.launch(b * out, kern::ActivationForward{pre, act_out, act});
    if (drop) {
      std::vector<int32_t> keep(size_t(b * out));
      for (int64_t r = 0; r < b; ++r)
        for (int64_t c = 0; c < out; ++c)
          keep[size_t(r * out + c)] = dropout_keep(
              seed_, epoch_, ids[size_t(r)], int64_t(l - 1), c, spec_.dropout);
      ex.upload(keep_[l], keep.data(), b * out);
      ex.launch(b * out,
                kern::Dropout{act_out, keep_[l].data(), a_[l].data(), scale});
    }
  }
  const float* y = a_[L].data();
  if (token) {
    ex.launch(
        b, kern::CrossEntropyForward{y, label_.data(), item_loss_.data(),
                                     row_max_.data(), row_sum_.data(), d_out_});
  } else if (spec_.loss == LossKind::mse) {
    ex.launch(b * d_out_, kern::GatherRows<float>{data_y_.data(), ids_.data(),
                                                  target_.data(), d_out_});
    ex.launch(
        b, kern::MseLossForward{y, target_.data(), item_loss_.data(), d_out_});
  } else {
    ex.launch(b, kern::GatherRows<int32_t>{data_label_.data(), ids_.data(),
                                           label_.data(), 1});
    ex.launch(
        b, kern::CrossEntropyForward{y, label_.data(), item_loss_.data(),
                                     row_max_.data(), row_sum_.data(), d_out_});
  }
  ex.launch(1, kern::SumSerial{item_loss_.data(), b, scalar_.data()});
  rows_ = b;
  float sum = 0;
  ex.download(scalar_, &sum, 1);
  return sum;
}

template <class Exec>
void Device<Exec>::backward(int64_t b, float w) {
  Exec& ex = *ex_;
  const size_t L = layout_.layers();
  const kern::Act act = device_detail::act_of(spec_.activation);
  const float* y = a_[L].data();
  // dz_L = dy = w * dloss/dy (no activation after the last layer).
  if (spec_.loss == LossKind::mse)
    ex.launch(b * d_out_,
              kern::MseLossBackward{y, target_.data(), dz_.data(), d_out_, w});
  else
    ex.launch(b * d_out_, kern::CrossEntropyBackward{
                              y, label_.data(), row_max_.data(),
                              row_sum_.data(), dz_.data(), d_out_, w});
  for (size_t l = L; l >= 1; --l) {
    const TensorView& W = layout_.weight(l - 1);
    const TensorView& B = layout_.bias(l - 1);
    const int64_t in = spec_.widths[l - 1], out = spec_.widths[l];
    if (l < L) hidden_backward(l, b, act);
    // dW_l += dz_l^T a_{l-1}: the product in full, then one add.
    ex.launch(out * in, kern::MatMul{.a = dz_.data(),
                                     .b = a_[l - 1].data(),
                                     .c = wtmp_.data(),
                                     .m = out,
                                     .n = in,
                                     .k = b,
                                     .lda = out,
                                     .ldb = in,
                                     .ldc = in,
                                     .ta = true,
                                     .tb = false});
    ex.launch(W.size(),
              kern::AccumulateGrad{grad_target() + W.offset, wtmp_.data()});
    ex.launch(out, kern::BiasGradColSum{dz_.data(), grad_target() + B.offset, b,
                                        out});
    // da_{l-1} = dz_l W_l (the token model: into the embedding's rows).
    if (l > 1 || spec_.kind == ModelKind::token)
      ex.launch(b * in, kern::MatMul{.a = dz_.data(),
                                     .b = params_.data() + W.offset,
                                     .c = da_.data(),
                                     .m = b,
                                     .n = in,
                                     .k = out,
                                     .lda = out,
                                     .ldb = in,
                                     .ldc = in,
                                     .ta = false,
                                     .tb = false});
  }
  if (spec_.kind == ModelKind::token) {
    const TensorView& E = layout_.tensors[size_t(layout_.embedding)];
    ex.launch(E.size(),
              kern::EmbeddingGrad{da_.data(), ids_.data(),
                                  grad_target() + E.offset, b, d_in_});
  }
}

// Hidden layer l's backward from da_ (wrt a_[l]) to dz_ (wrt z_[l]):
// dropout, the activation, the norm.
template <class Exec>
void Device<Exec>::hidden_backward(size_t l, int64_t b, kern::Act act) {
  Exec& ex = *ex_;
  const int64_t out = spec_.widths[l];
  const bool norm = spec_.norm != NormKind::none;
  const bool drop = spec_.dropout > 0;
  const float* dact = da_.data();
  if (drop) {
    ex.launch(b * out, kern::Dropout{da_.data(), keep_[l].data(), dp_.data(),
                                     float(1.0 / (1.0 - spec_.dropout))});
    dact = dp_.data();
  }
  const float* pre = norm ? y_[l].data() : z_[l].data();
  const float* act_out = drop ? h_[l].data() : a_[l].data();
  float* dpre = norm ? dpre_.data() : dz_.data();
  ex.launch(b * out, kern::ActivationBackward{dact, pre, act_out, dpre, act});
  if (!norm) return;
  const TensorView& G = layout_.norm_weight(l - 1);
  const TensorView& Bt = layout_.norm_bias(l - 1);
  const float* gamma = params_.data() + G.offset;
  ex.launch(out,
            kern::NormAffineGrad{dpre, xh_[l].data(), grad_target() + G.offset,
                                 grad_target() + Bt.offset, b, out});
  const NormGeometry geo = norm_geometry(spec_, b, out);
  ex.launch(geo.G, kern::NormBackwardStats{dpre, xh_[l].data(), gamma,
                                           s1_.data(), s2_.data(), geo.E,
                                           geo.gs, geo.es, geo.row_groups});
  ex.launch(b * out, kern::NormBackwardApply{
                         dpre, xh_[l].data(), gamma, s1_.data(), s2_.data(),
                         rstd_[l].data(), dz_.data(), out, geo.row_groups});
}

template <class Exec>
void Device<Exec>::zero_grad() {
  ex_->launch(layout_.total, kern::Fill{grads_.data(), 0.0f});
}

template <class Exec>
float Device<Exec>::forward_backward(const std::vector<int64_t>& ids,
                                     LossWeight weight) {
  if (weight.den < 1 || weight.num < 1)
    device_detail::bad("loss weight num/den must be >= 1, got " +
                       std::to_string(weight.num) + "/" +
                       std::to_string(weight.den));
  if (ids.empty()) return 0.0f;
  const float sum = forward_and_loss(ids, true);
  const int64_t P = layout_.total;
  if (staged()) ex_->launch(P, kern::Fill{fresh_.data(), 0.0f});
  // w = num/den, one correctly rounded float division (as loss / den's
  // backward gives in PyTorch); exact for den <= 2^24 a power of two.
  backward(rows_, float(weight.num) / float(weight.den));
  if (staged())
    ex_->launch(
        P, kern::AccumulateGradRounded{grads_.data(), fresh_.data(), fmt_});
  return sum;
}

template <class Exec>
float Device<Exec>::loss(const std::vector<int64_t>& ids) {
  if (ids.empty()) return 0.0f;
  return forward_and_loss(ids, false);
}

template <class Exec>
void Device<Exec>::add_l2(double lambda, int64_t den) {
  if (den < 1) device_detail::bad("add_l2: den must be >= 1");
  const float coef = float(lambda / double(den));
  const int64_t P = layout_.total;
  if (staged()) ex_->launch(P, kern::Fill{fresh_.data(), 0.0f});
  ex_->launch(P, kern::AddL2{grad_target(), params_.data(), coef});
  if (staged())
    ex_->launch(
        P, kern::AccumulateGradRounded{grads_.data(), fresh_.data(), fmt_});
}

template <class Exec>
float Device<Exec>::grad_norm() {
  ex_->launch(1, kern::GradNorm{grads_.data(), layout_.total, scalar_.data()});
  float norm = 0;
  ex_->download(scalar_, &norm, 1);
  return norm;
}

template <class Exec>
void Device<Exec>::scale_grads(float f) {
  ex_->launch(layout_.total, kern::ScaleGrads{grads_.data(), f, fmt_});
}

template <class Exec>
void Device<Exec>::set_grad_buffer(GradBuffer b) {
  fmt_ = kern::Fmt(int32_t(b));
  if (staged() && fresh_.size() < layout_.total)
    fresh_ = ex_->template alloc<float>(layout_.total);
}

template <class Exec>
bool Device<Exec>::grads_finite() {
  ex_->launch(
      1, kern::CountNonFinite{grads_.data(), layout_.total, scalar_.data()});
  float bad = 0;
  ex_->download(scalar_, &bad, 1);
  return bad == 0.0f;
}

template <class Exec>
void Device<Exec>::optimizer_step(const OptimizerSpec& opt, double lr) {
  ++steps_;
  const int64_t P = layout_.total;
  if (opt.kind == OptimizerKind::sgd) {
    kern::SgdStep k{};
    k.p = params_.data();
    k.g = grads_.data();
    k.buf = exp_avg_.data();
    k.neg_lr = float(-lr);
    k.momentum = float(opt.momentum);
    k.wd = float(opt.weight_decay);
    k.use_wd = opt.weight_decay != 0.0;
    k.use_momentum = opt.momentum != 0.0;
    k.first = !has_m_;  // PyTorch: momentum_buffer is None
    ex_->launch(P, k);
    if (k.use_momentum) has_m_ = true;
    return;
  }
  if (!has_m_) ex_->launch(P, kern::Fill{exp_avg_.data(), 0.0f});
  if (!has_v_) ex_->launch(P, kern::Fill{exp_avg_sq_.data(), 0.0f});
  const double t = double(steps_);
  const double bc1 = 1.0 - std::pow(opt.beta1, t);
  const double bc2 = 1.0 - std::pow(opt.beta2, t);
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  kern::AdamStep k{};
  k.p = params_.data();
  k.g = grads_.data();
  k.m = exp_avg_.data();
  k.v = exp_avg_sq_.data();
  k.b1 = float(opt.beta1);
  k.one_minus_b1 = float(1.0 - opt.beta1);
  k.b2 = float(opt.beta2);
  k.one_minus_b2 = float(1.0 - opt.beta2);
  k.neg_step_size = float(-step_size);
  k.bc2_sqrt = float(bc2_sqrt);
  k.eps = float(opt.eps);
  k.wd = float(opt.weight_decay);
  const bool adamw = opt.kind == OptimizerKind::adamw;
  k.coupled_wd = !adamw && opt.weight_decay != 0.0;
  k.decoupled_wd = adamw;  // param.mul_(1 - lr * wd), even when wd = 0
  k.decay_mul = float(1.0 - lr * opt.weight_decay);
  ex_->launch(P, k);
  has_m_ = has_v_ = true;
}

template <class Exec>
EngineState<float> Device<Exec>::state() const {
  const int64_t P = layout_.total;
  EngineState<float> s;
  s.params.resize(size_t(P));
  s.grads.resize(size_t(P));
  ex_->download(params_, s.params.data(), P);
  ex_->download(grads_, s.grads.data(), P);
  if (has_m_) {
    s.exp_avg.resize(size_t(P));
    ex_->download(exp_avg_, s.exp_avg.data(), P);
  }
  if (has_v_) {
    s.exp_avg_sq.resize(size_t(P));
    ex_->download(exp_avg_sq_, s.exp_avg_sq.data(), P);
  }
  s.optimizer_steps = steps_;
  if (layout_.buffer_total > 0) {
    s.buffers.resize(size_t(layout_.buffer_total));
    ex_->download(buffers_, s.buffers.data(), layout_.buffer_total);
  }
  return s;
}

template <class Exec>
void Device<Exec>::set_state(const EngineState<float>& s) {
  const int64_t P = layout_.total;
  auto check = [&](const std::vector<float>& v, const char* name,
                   bool may_be_empty) {
    if (int64_t(v.size()) == P || (may_be_empty && v.empty())) return;
    device_detail::bad(std::string("set_state: ") + name + " has " +
                       std::to_string(v.size()) + " values, the model has " +
                       std::to_string(P));
  };
  check(s.params, "params", false);
  check(s.grads, "grads", true);
  check(s.exp_avg, "exp_avg", true);
  check(s.exp_avg_sq, "exp_avg_sq", true);
  if (s.optimizer_steps < 0) device_detail::bad("set_state: negative steps");
  if (!s.buffers.empty() && int64_t(s.buffers.size()) != layout_.buffer_total)
    device_detail::bad(
        "set_state: buffers have " + std::to_string(s.buffers.size()) +
        " values, the model has " + std::to_string(layout_.buffer_total));
  if (!s.buffers.empty())
    ex_->upload(buffers_, s.buffers.data(), layout_.buffer_total);
  ex_->upload(params_, s.params.data(), P);
  auto put = [&](Buffer<float>& dst, const std::vector<float>& v) {
    if (v.empty())
      ex_->launch(P, kern::Fill{dst.data(), 0.0f});
    else
      ex_->upload(dst, v.data(), P);
  };
  put(grads_, s.grads);
  put(exp_avg_, s.exp_avg);
  put(exp_avg_sq_, s.exp_avg_sq);
  has_m_ = !s.exp_avg.empty();
  has_v_ = !s.exp_avg_sq.empty();
  steps_ = s.optimizer_steps;
}

}  // namespace accumcheck
