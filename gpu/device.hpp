// Device<Executor>: the float32 engine (sim/engine.hpp's Engine concept).
//
// Parameters, gradients and optimizer state live in flat float32 arenas
// laid out by sim/layout.hpp (PyTorch names and layouts).  Every
// step, the matrix products included (kern::MatMul: each output's sum in
// one written order, no BLAS), is a kernel body from gpu/kernels.hpp
// launched by the executor, so every executor on every machine computes
// the same bits.  The whole dataset is uploaded once; a micro-batch is
// gathered by id on the device.
//
// Per micro-batch (forward_backward(ids, den)), for layers l = 1..L
// (layer l maps a_{l-1} [b x w_{l-1}] to z_l, a_l [b x w_l]):
//   forward   z_l = a_{l-1} W_l^T            MatMul              (set)
//             z_l += b_l; a_l = f(z_l)        BiasActivationForward (set)
//             (no activation after the last layer: a_L = z_L = y)
//   loss      loss_r per sample, summed in row order     (returned)
//             dy = (1/den) * dloss_r/dy                    (set)
//   backward  dz_l = da_l * f'(z_l)           ActivationBackward  (set)
//             tmp  = dz_l^T a_{l-1}           MatMul              (set)
//             dW_l += tmp                     AccumulateGrad   (accumulate)
//             db_l += colsum(dz_l)            BiasGradColSum   (accumulate)
//             da_{l-1} = dz_l W_l             MatMul       (set; l > 1)
// Each weight gradient is computed in full and then added once, as
// PyTorch's AccumulateGrad does: a second identical backward doubles the
// gradient exactly.
//
// Optimizer state follows PyTorch's lazy creation: state().exp_avg is
// empty until a step that uses it (SGD with momentum, Adam, AdamW) and
// exp_avg_sq until an Adam/AdamW step; set_state accepts either empty or
// full-size vectors.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/executor.hpp"
#include "gpu/kernels.hpp"
#include "sim/data.hpp"
#include "sim/engine.hpp"
#include "sim/layout.hpp"
#include "sim/scenario.hpp"

namespace accumcheck {

template <class Exec>
class Device {
 public:
  using Real = float;
  using Executor = Exec;
  template <class T>
  using Buffer = typename Exec::template Buffer<T>;

  // Uploads the dataset and the initial parameters (layout_of(spec).total
  // floats); gradients start at zero, optimizer state empty.  The executor
  // must outlive the device.  Throws std::invalid_argument on a dataset or
  // parameter vector that does not fit the model.
  Device(const ModelSpec& spec, const Dataset& data,
         const std::vector<float>& initial_params, Exec& executor);
  // The same with an executor of its own, default-constructed (for the
  // CUDA executor that throws when no GPU is present).
  Device(const ModelSpec& spec, const Dataset& data,
         const std::vector<float>& initial_params);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // --- the Engine contract (sim/engine.hpp) ---
  void zero_grad();
  int64_t items(const std::vector<int64_t>& ids) const;
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  float forward_backward(const std::vector<int64_t>& ids, LossWeight weight);
  void add_l2(double lambda, int64_t den);
  float grad_norm();
  void scale_grads(float f);
  void optimizer_step(const OptimizerSpec& opt, double lr);
  EngineState<float> state() const;
  void set_state(const EngineState<float>& s);

  // --- precision (sim/scenario.hpp GradBuffer; the trainer sets it) ---
  // The format the .grad buffer accumulates in: fp32 (the default), or
  // bf16 / fp16, where each backward's fresh float32 gradient (computed in
  // a staging arena) is added as AccumulateGradRounded does and clip's and
  // unscale_'s multiplications round to the format too.  The buffer stays
  // a float32 arena holding values of the format; parameters and
  // optimizer state stay float32 (master weights).
  void set_grad_buffer(GradBuffer b);
  GradBuffer grad_buffer() const { return GradBuffer(int(fmt_)); }
  // No inf or NaN in the gradient (GradScaler's found_inf check).
  bool grads_finite();

  // --- extras ---
  // Sum of the item losses of `ids` at the current parameters; gradients
  // untouched.
  float loss(const std::vector<int64_t>& ids);
  const ParamLayout& layout() const { return layout_; }
  const ModelSpec& spec() const { return spec_; }
  Exec& executor() { return *ex_; }

 private:
  void init(const Dataset& data, const std::vector<float>& initial_params);
  void ensure_capacity(int64_t rows);
  // Returns the sum of the item losses; sets rows_ (samples or tokens).
  float forward_and_loss(const std::vector<int64_t>& ids, bool update_running);
  void backward(int64_t rows, float w);
  int64_t gather_tokens(const std::vector<int64_t>& ids);
  void hidden_backward(size_t l, int64_t rows, kern::Act act);
  // Where a backward writes its gradient: the .grad buffer itself (fp32),
  // or the staging arena that AccumulateGradRounded adds from.
  float* grad_target() { return staged() ? fresh_.data() : grads_.data(); }
  bool staged() const { return fmt_ != kern::Fmt::fp32; }
  int64_t rows_ = 0;
  kern::Fmt fmt_ = kern::Fmt::fp32;
  Buffer<float> fresh_;

  ModelSpec spec_;
  ParamLayout layout_;
  std::unique_ptr<Exec> owned_;
  Exec* ex_;
  int64_t n_samples_ = 0, d_in_ = 0, d_out_ = 0, max_width_ = 0;
  int64_t steps_ = 0;
  int64_t epoch_ = 0;
  bool has_m_ = false, has_v_ = false;
  uint64_t seed_ = 0;
  // Token models: the sequences, kept on the host to build the rows.
  int64_t max_len_ = 0;
  std::vector<int32_t> tokens_, token_targets_, length_;
  Buffer<float> buffers_;  // BatchNorm running statistics

  Buffer<float> params_, grads_, exp_avg_, exp_avg_sq_;
  Buffer<float> data_x_, data_y_;
  Buffer<int32_t> data_label_;
  // Micro-batch workspace, sized for cap_ rows.
  int64_t cap_ = 0;
  Buffer<int64_t> ids_;
  std::vector<Buffer<float>> a_;  // a_[0]: the gathered input; a_[l], l >= 1
  std::vector<Buffer<float>> z_;  // z_[l], l >= 1 (z_[0] unused)
  Buffer<float> target_, da_, dz_, wtmp_, item_loss_, row_max_, row_sum_;
  Buffer<int32_t> label_;
  Buffer<float> scalar_;
  // Hidden layers with a norm / dropout (indexed like z_).
  std::vector<Buffer<float>> xh_, y_, h_, mean_, rstd_;
  std::vector<Buffer<int32_t>> keep_;
  Buffer<float> dp_, dpre_, s1_, s2_;
};

}  // namespace accumcheck
