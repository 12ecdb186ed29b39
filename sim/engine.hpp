// The engine contract: what Trainer<Engine> (sim/trainer.hpp) asks of an
// engine.  Engines only do tensor math; every accumulation decision (when
// to zero, how to weight, when to step, clip and schedule) is the
// trainer's.  Implemented by Oracle (oracle/, Boost.Multiprecision) and
// Device<Executor> (gpu/, float32; emulated and CUDA executors).
//
// Engines may also offer `void set_epoch(int64_t)`: the trainer calls it
// at each window, so dropout masks are keyed by (seed, epoch, sample id,
// layer, unit).  And `Real clip_grad_norm(double max_norm)`: an engine
// that offers it clips itself (the contract tier's coefficient engine,
// verify/contract/coefficient_engine.hpp, keeps the clip factor as a symbol);
// the others get the trainer's clip_grad_norm_ formula.  And `void
// hold_rank(int64_t r)` with `void average_ranks(int64_t R)`: an engine whose
// gradient buffer EngineState cannot carry (the coefficient engine's exact
// coefficients) keeps every DDP rank's buffer itself; the trainer calls
// hold_rank when it swaps ranks and average_ranks for DDP's all-reduce.
//
// Model (sim/scenario.hpp ModelSpec): an MLP of Linear layers with the
// activation between them (none after the last), then the loss:
//   mse            l_i = (1/d_out) * sum_j (y_ij - t_ij)^2   (nn.MSELoss per
//   sample) cross_entropy  l_i = -log softmax(y_i)[label_i]
//   (nn.CrossEntropyLoss per sample) gelu is the exact erf form: x * (1 + erf(x
//   / sqrt 2)) / 2.
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

// The weight of one micro-batch's summed item losses: num/den, exact
// integers (the oracle forms it with one division).  num is 1 except for
// a correct DDP rank, which weighs its items R/N_w so that DDP's average
// over R ranks leaves each item 1/N_w.  Implicit from an integer: 1/den.
struct LossWeight {
  int64_t num = 1, den = 1;
  LossWeight(int64_t d) : den(d) {}  // NOLINT: 1/den reads as den
  LossWeight(int64_t n, int64_t d) : num(n), den(d) {}
  bool operator==(const LossWeight&) const = default;
};

// Everything an engine holds between calls, in its own Real type: enough
// to restart a run anywhere (teacher forcing).
template <class Real>
struct EngineState {
  std::vector<Real> params;
  std::vector<Real> grads;       // the .grad buffers, accumulated in place
  std::vector<Real> exp_avg;     // SGD momentum_buffer, or Adam's m
  std::vector<Real> exp_avg_sq;  // Adam's v (empty for SGD)
  int64_t optimizer_steps = 0;   // PyTorch's state['step']
  // Buffers (BatchNorm running statistics, ParamLayout::buffers); empty
  // for models without any.  Updated by each training-mode forward.
  std::vector<Real> buffers;
};

template <class E>
concept Engine = requires(E e, const E ce, const std::vector<int64_t>& ids,
                          typename E::Real r, const OptimizerSpec& opt) {
  typename E::Real;
  // grads = 0.
  { e.zero_grad() } -> std::same_as<void>;
  // The loss-bearing items of a shard: ids.size() for sample losses, the
  // non-ignored tokens for token losses (N_w is the sum over the window,
  // counted before its first backward).
  { ce.items(ids) } -> std::same_as<int64_t>;
  // grads += (num/den) * sum_{i in ids} d l_i / d params  ("+=", like
  // loss.backward()); returns sum_{i in ids} l_i (unweighted).
  { e.forward_backward(ids, LossWeight{1}) } -> std::same_as<typename E::Real>;
  // grads += (lambda/den) * params: the gradient of lambda*|p|^2/(2*den).
  { e.add_l2(double{}, int64_t{1}) } -> std::same_as<void>;
  // sqrt(sum grads^2), over every tensor (clip_grad_norm_'s total norm).
  { e.grad_norm() } -> std::same_as<typename E::Real>;
  // grads *= f.
  { e.scale_grads(r) } -> std::same_as<void>;
  // One optimizer.step() with learning rate lr (PyTorch conventions,
  // DESIGN.md section 3); increments optimizer_steps first.
  { e.optimizer_step(opt, double{}) } -> std::same_as<void>;
  { ce.state() } -> std::same_as<EngineState<typename E::Real>>;
  { e.set_state(ce.state()) } -> std::same_as<void>;
};

// Optional, beyond the contract: an engine that hands out its gradient
// and parameters (Trainer copies them alone, where state() would copy
// every tensor), and exchanges its state with `s` (the Trainer's switch
// between DDP ranks: no tensor copied).  swap_state(s) leaves the engine
// as set_state(s) would and `s` as state() was.
template <class E>
concept ExposesTensors = requires(E e, EngineState<typename E::Real>& s) {
  { e.grads() } -> std::convertible_to<const std::vector<typename E::Real>&>;
  { e.params() } -> std::convertible_to<const std::vector<typename E::Real>&>;
  { e.swap_state(s) } -> std::same_as<void>;
};

}  // namespace accumcheck
