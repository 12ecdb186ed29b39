// Trainer<Engine>'s step block (sim/trainer.hpp): GradScaler's loss
// scaling (scale, unscale_, update, skipped steps), the EMA of the
// parameters, the optimizer state advanced without a step, the clip
// (global, per rank's shard), optimizer.step() and scheduler.step() on
// every rank.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/errors.hpp"
#include "sim/trainer_loop.hpp"

namespace accumcheck {

// The scaler's starting scale; the EMA's copy of the parameters
// (AveragedModel copies them when built; a teacher-forced window keeps
// the EMA it was given, or starts one from the state).
template <Engine E>
void Trainer<E>::init_state_beyond_gradients(bool fresh_run) {
  if (scaling_ && c_.scale_exp == TrainerCounters::kNoScale)
    c_.scale_exp = s_.precision.scale_exp;
  inf_pending_ = false;
  if (s_.ema.enabled && (fresh_run || ema_.empty())) ema_ = params_copy();
}

// The loss weight times the scale 2^e (exact: the weight stays a
// rational, num * 2^e or den * 2^-e).
template <Engine E>
LossWeight Trainer<E>::scaled(LossWeight w) const {
  if (!scaling_) return w;
  const int64_t e = c_.scale_exp;
  int64_t& v = e >= 0 ? w.num : w.den;
  const int64_t by = e >= 0 ? e : -e;
  if (by > 62 || v > (INT64_MAX >> by))
    throw ScaleRangeError(
        s_.path, 0, 0, "precision",
        "loss scale 2^" + std::to_string(e) +
            " leaves the exactly representable loss weights (|e| <= 62) "
            "in this run: a smaller init_scale or a longer "
            "growth_interval keeps it in range");
  v <<= by;
  return w;
}

template <Engine E>
bool Trainer<E>::grads_finite() {
  if constexpr (requires { e_.grads_finite(); }) {
    return e_.grads_finite();
  } else {
    return std::isfinite(static_cast<double>(e_.grad_norm()));
  }
}

// scaler.unscale_() on every rank: grads *= 2^-e (exact), found_inf
// when any rank holds an inf or NaN (or an injected overflow).
template <Engine E>
bool Trainer<E>::unscale_all(int64_t micro) {
  bool found = inf_pending_;
  const double S = std::ldexp(1.0, int(c_.scale_exp));
  each_rank([&](int64_t) {
    found = !grads_finite() || found;
    e_.scale_grads(Real(std::ldexp(1.0, -int(c_.scale_exp))));
    event(EventKind::unscale, micro, [&](Event& ev) { ev.loss_scale = S; });
  });
  return found;
}

// scaler.update(): back off on an inf/NaN, grow after growth_interval
// clean updates in a row.
template <Engine E>
void Trainer<E>::scaler_update(int64_t micro, bool found_inf) {
  const PrecisionSpec& p = s_.precision;
  if (found_inf) {
    c_.scale_exp += p.backoff_exp;
    c_.growth_tracker = 0;
  } else if (++c_.growth_tracker == p.growth_interval) {
    c_.scale_exp += p.growth_exp;
    c_.growth_tracker = 0;
  }
  event(EventKind::scaler_update, micro,
        [&](Event& ev) { ev.loss_scale = std::ldexp(1.0, int(c_.scale_exp)); });
}

// ema = ema * decay + p * (1 - decay), rank 0's parameters (the ranks
// agree whenever they are in sync).  The factors are rounded once to
// the engine's Real, as PyTorch's mul_(decay).add_(p, alpha=1-decay).
template <Engine E>
void Trainer<E>::ema_update(int64_t micro) {
  use_rank(0);
  const std::vector<Real> p = params_copy();
  if (ema_.size() != p.size()) ema_ = p;
  const Real d(s_.ema.decay), rest(1.0 - s_.ema.decay);
  for (size_t i = 0; i < p.size(); ++i) {
    const Real kept = ema_[i] * d;
    const Real add = p[i] * rest;
    ema_[i] = kept + add;
  }
  event(EventKind::ema_update, micro);
  run_.ema.push_back({c_.optimizer_steps, since_step_,
                      opt_.record_values ? ema_ : std::vector<Real>{}});
}

// optimizer-state-every-micro-step: Adam's t advanced and AdamW's
// decoupled decay p *= float(1 - lr*wd) applied, without a step.
template <Engine E>
void Trainer<E>::advance_optimizer_state() {
  each_rank([&](int64_t) {
    EngineState<Real> st = e_.state();
    ++st.optimizer_steps;
    if (s_.optimizer.kind == OptimizerKind::adamw) {
      const Real mul(1.0 - current_lr() * s_.optimizer.weight_decay);
      for (Real& p : st.params) p = p * mul;
    }
    e_.set_state(st);
  });
}

// The step of a window: [clip if clip-before-unscale] unscale_ (loss
// scaling), clip, optimizer.step() unless unscale_ found an inf/NaN,
// scaler.update(), the EMA after a step.  Returns whether it stepped.
template <Engine E>
bool Trainer<E>::step_block(int64_t micro, bool clip_here) {
  const bool pre_clip = clip_here && scaling_ && b_.clip_before_unscale;
  if (pre_clip) each_rank([&](int64_t) { clip(micro); });
  const bool found =
      scaling_ && (unscale_all(micro) ||
                   std::binary_search(opt_.forced_skip.begin(),
                                      opt_.forced_skip.end(), backward_));
  if (clip_here && !pre_clip) each_rank([&](int64_t) { clip(micro); });
  if (found) {
    ++c_.skipped_steps;
    run_.skipped.push_back({c_.optimizer_steps, backward_, loss_scale()});
    since_step_ = 0;
  } else {
    optimizer_step(micro);
  }
  if (scaling_) scaler_update(micro, found);
  if (!found && s_.ema.enabled) ema_update(micro);
  return !found;
}

// Whether the clip runs at the optimizer step (not per micro-step, not
// on each rank before the all-reduce).
template <Engine E>
bool Trainer<E>::clips_at_step() const {
  return s_.clip.enabled && !b_.clip_per_micro_step &&
         !(b_.clip_before_all_reduce && R_ > 1);
}

// clip_grad_norm_: coef = c / (norm + 1e-6), clamped to 1, in the
// engine's arithmetic (float32 tensors in PyTorch).
// An engine that keeps the factor symbolic (the contract tier's
// coefficient engine) clips itself.
template <Engine E>
void Trainer<E>::clip(int64_t micro) {
  Real norm;
  if constexpr (requires { e_.clip_grad_norm_shard(double{}, int64_t{}); }) {
    // A symbolic engine: ddp-clip-local-norm is this rank's own symbol,
    // the factor of its shard's norm (the rank's shard of the gradient
    // holds nothing else).
    if (b_.clip_local_norm && R_ > 1) {
      norm = e_.clip_grad_norm_shard(s_.clip.max_norm, R_);
      event(EventKind::clip, micro,
            [&](Event& ev) { ev.grad_norm = static_cast<double>(norm); });
      return;
    }
  } else if (b_.clip_local_norm && R_ > 1) {
    return clip_sharded(micro);
  }
  if constexpr (requires { e_.clip_grad_norm(double{}); }) {
    norm = e_.clip_grad_norm(s_.clip.max_norm);
  } else {
    norm = e_.grad_norm();
    const Real coef = Real(s_.clip.max_norm) / (norm + Real(1e-6));
    if (coef < Real(1)) e_.scale_grads(coef);
  }
  event(EventKind::clip, micro,
        [&](Event& ev) { ev.grad_norm = static_cast<double>(norm); });
}

// ddp-clip-local-norm: the flat gradient in R contiguous chunks of
// ceil(P/R) (ZeRO/FSDP shards), chunk q scaled by
// min(1, c/(|chunk q| + 1e-6)); every replica applies every chunk's
// coefficient (what the all-gather after the sharded step gives); the
// event carries this rank's own chunk norm.
template <Engine E>
void Trainer<E>::clip_sharded(int64_t micro) {
  using std::sqrt;
  EngineState<Real> st = e_.state();
  const size_t P = st.grads.size(), chunk = (P + size_t(R_) - 1) / size_t(R_);
  Real own(0);
  for (size_t q = 0; q < size_t(R_); ++q) {
    const size_t lo = std::min(P, q * chunk), hi = std::min(P, lo + chunk);
    Real sq(0);
    for (size_t i = lo; i < hi; ++i) {
      const Real g2 = st.grads[i] * st.grads[i];
      sq += g2;
    }
    const Real norm = sqrt(sq);
    if (q == size_t(rank_)) own = norm;
    const Real coef = Real(s_.clip.max_norm) / (norm + Real(1e-6));
    if (coef < Real(1))
      for (size_t i = lo; i < hi; ++i) st.grads[i] *= coef;
  }
  e_.set_state(st);
  event(EventKind::clip, micro,
        [&](Event& ev) { ev.grad_norm = static_cast<double>(own); });
}

// optimizer.step() on every rank; the record holds rank 0's gradient
// and parameters (and the other ranks' parameters).
template <Engine E>
void Trainer<E>::optimizer_step(int64_t micro) {
  const double lr = current_lr();
  StepRecord<Real> rec;
  rec.step = c_.optimizer_steps;
  rec.epoch = epoch_;
  rec.window = c_.windows;
  rec.lr = lr;
  use_rank(0);
  rec.grad_norm = static_cast<double>(e_.grad_norm());
  if (opt_.record_values) rec.grad = grads_copy();
  each_rank([&](int64_t) {
    if (before_step_) before_step_(rec.step, e_);
    e_.optimizer_step(s_.optimizer, lr);
    event(EventKind::optimizer_step, micro, [&](Event& ev) { ev.lr = lr; });
  });
  ++c_.optimizer_steps;
  since_step_ = 0;
  if (opt_.record_values) {
    for (int64_t r = R_ - 1; r >= 0; --r) {
      use_rank(r);
      if (r == 0)
        rec.param = params_copy();
      else
        rec.rank_param.insert(rec.rank_param.begin(), params_copy());
    }
  }
  run_.steps.push_back(std::move(rec));
  if (after_step_)
    each_rank([&](int64_t) { after_step_(run_.steps.back().step, e_); });
}

// Every rank's scheduler.step() (ranks in lockstep share one counter);
// ddp-scheduler-per-rank: R calls per rank.
template <Engine E>
void Trainer<E>::scheduler_step(int64_t micro) {
  const int64_t calls = b_.scheduler_per_rank ? R_ : 1;
  for (int64_t c = 0; c < calls; ++c) {
    ++c_.scheduler_steps;
    for (int64_t r = 0; r < R_; ++r)
      event(EventKind::scheduler_step, micro, [&](Event& ev) {
        ev.lr = current_lr();
        ev.rank = r;
      });
  }
}

}  // namespace accumcheck
