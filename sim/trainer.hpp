// Trainer<Engine>: the only training loop in accumcheck.
//
// Every engine (oracle, emulated device, CUDA device) and every semantics
// (`correct`, each pitfall, pairs of pitfalls, the large-batch reference)
// runs through this file.  A pitfall is a field of Behavior
// (sim/pitfalls.hpp), read at exactly the point of the loop where the
// buggy trainer's call order differs from the correct one.
//
// The `correct` window (DESIGN.md section 5):
//   N_w = items in the window (Engine::items: samples, or loss-bearing
//   tokens for token losses), counted before the first backward;
//   for each micro-batch k: backward of (sum of item losses) / N_w  (+=);
//   clip once; optimizer.step(); scheduler.step(); zero_grad().
// The partial last window is stepped with its own N_w.
//
// Pinned call orders of the pitfalls, per micro-step:
//   [zero_grad if zero-grad-every-micro-step or seed-002-loop]
//   forward_backward (weight 1/den, den from `normalization`)
//   [l2: grads += lambda/(K_w or 1) * theta]
//   [clip if clip-per-micro-step]
//   [clip, optimizer.step if step-every-micro-step: the clip that goes
//    with every step]
//   [scheduler.step if scheduler-per-micro-step]   (after the boundary's step)
// and at the window's end the boundary block (step, scheduler, zero_grad)
// as the behaviour says (scheduler-before-optimizer: scheduler, step,
// zero_grad; scheduler-per-epoch: no scheduler there, one scheduler.step()
// after each epoch's last window).
// The windows an epoch is cut into are the plan's, except where a pitfall
// draws or cuts them differently (drawn()): skip-short-micro-batch drops
// the epoch's short last micro-batch, window-boundary-off-by-one cuts
// [0], [1..K], [K+1..2K], ... with the leftover a partial window.
//
// K may change from epoch to epoch (EpochPlan::accumulation,
// sim/k_schedule.hpp): the loop reads K of the epoch it is in.  The ramp
// pitfalls keep correct's call order and change values only:
// ramp-normalization-stale weighs by the first epoch's K,
// ramp-schedule-horizon-fixed resolves a total = "auto" horizon with it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "sim/engine.hpp"
#include "sim/k_schedule.hpp"
#include "sim/lr_schedule.hpp"
#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/run.hpp"
#include "sim/scenario.hpp"

namespace accumcheck {

struct TrainerCounters {
  int64_t optimizer_steps = 0;  // optimizer.step() calls so far
  int64_t scheduler_steps = 0;  // scheduler.step() calls so far
  int64_t windows = 0;          // windows finished so far
};

struct TrainerOptions {
  bool record_values = true;  // keep grads/params per step and window
  bool record_events = true;
  int64_t max_steps = -1;  // stop after this many optimizer steps
  // Stop after this many windows (-1: none), so that a run which stops
  // stepping (a pitfall that never steps) ends too: run_experiment() sets
  // it to max_steps, the windows of the large-batch reference.
  int64_t max_windows = -1;
};

// The trainer's lr before any schedule: the scenario's lr, scaled by K or
// sqrt(K) when the scenario teaches that advice.
inline double base_lr(const Scenario& s) {
  const double K = double(s.batching.accumulation);
  switch (s.trainer.lr_scaling) {
    case LrScaling::none:
      return s.optimizer.lr;
    case LrScaling::linear:
      return s.optimizer.lr * K;
    case LrScaling::sqrt:
      return s.optimizer.lr * std::sqrt(K);
  }
  return s.optimizer.lr;
}

template <Engine E>
class Trainer {
 public:
  using Real = typename E::Real;

  Trainer(E& engine, const Scenario& scenario, Behavior behavior,
          double base_lr, TrainerOptions options = {})
      : e_(engine),
        s_(scenario),
        b_(behavior),
        base_lr_(base_lr),
        opt_(options),
        schedule_(
            behavior.schedule_horizon_in_micro_steps
                ? stretched(
                      resolved_schedule(scenario, behavior.horizon_initial_k),
                      scenario.batching.accumulation)
                : resolved_schedule(scenario, behavior.horizon_initial_k)) {}

  // Runs every epoch of `plan` from the engine's current state.
  Run<Real> run(const Plan& plan, std::string name) {
    run_ = Run<Real>{};
    run_.name = std::move(name);
    // A lazy plan builds each epoch here, when the loop reaches it.
    plan.visit([&](int64_t ep, const EpochPlan& planned) {
      // The pitfalls that draw or cut windows differently get their own
      // copy of the epoch (drawn()); every other loop walks the plan's.
      K_ = planned.accumulation;  // K may change from epoch to epoch
      EpochPlan own;
      const bool redrawn = b_.skip_short_micro_batch || b_.window_off_by_one;
      if (redrawn) own = drawn(planned);
      const EpochPlan& epoch = redrawn ? own : planned;
      for (size_t w = 0; w < epoch.windows.size() && !stop(); ++w)
        window(epoch.windows[w], ep, w + 1 == epoch.windows.size(),
               epoch.micro_steps());
      if (b_.scheduler_per_epoch && !epoch.windows.empty()) scheduler_step(-1);
      return !stop();
    });
    return std::move(run_);
  }

  // Teacher forcing: one window from the engine's current state (set it
  // with Engine::set_state) and the given counters.  The window is treated
  // as the last of an epoch of `epoch_micro_steps` micro-steps when
  // `last_of_epoch`.  Returns the records of that window alone.
  Run<Real> run_window(const Window& w, int64_t K, TrainerCounters counters,
                       bool last_of_epoch = false,
                       int64_t epoch_micro_steps = 0) {
    run_ = Run<Real>{};
    K_ = K;
    c_ = counters;
    window(w, 0, last_of_epoch, epoch_micro_steps);
    return std::move(run_);
  }

  // Teacher forcing along an external trajectory (certify): called with
  // the optimizer step's index and the engine, `before_step` after the
  // accumulated gradient is recorded and before optimizer.step() (it may
  // replace the gradient with the trace's), `after_step` after the new
  // parameters are recorded (it may reset them to the trace's).
  using StepHook = std::function<void(int64_t step, E& engine)>;
  void set_step_hooks(StepHook before_step, StepHook after_step) {
    before_step_ = std::move(before_step);
    after_step_ = std::move(after_step);
  }

  const TrainerCounters& counters() const { return c_; }
  double current_lr() const {
    return base_lr_ * lr_multiplier(schedule_, c_.scheduler_steps);
  }

 private:
  bool done() const {
    return opt_.max_steps >= 0 && c_.optimizer_steps >= opt_.max_steps;
  }
  bool stop() const {
    return done() || (opt_.max_windows >= 0 && c_.windows >= opt_.max_windows);
  }

  // The epoch's windows as this trainer draws and cuts them.
  EpochPlan drawn(const EpochPlan& planned) const {
    std::vector<MicroBatch> micro;
    for (const Window& w : planned.windows)
      micro.insert(micro.end(), w.micro.begin(), w.micro.end());
    if (b_.skip_short_micro_batch && !micro.empty()) {
      bool is_short = false;
      for (const auto& shard : micro.back().shards)
        is_short = is_short || int64_t(shard.size()) < s_.batching.micro_batch;
      if (is_short) micro.pop_back();
    }
    EpochPlan e;
    e.accumulation = planned.accumulation;
    size_t at = 0;
    if (b_.window_off_by_one && !micro.empty()) {
      e.windows.push_back(Window{{micro[0]}, false});  // i = 0: 0 % K == 0
      at = 1;
    }
    while (at < micro.size()) {
      Window w;
      const size_t end = std::min(micro.size(), at + size_t(K_));
      w.micro.assign(micro.begin() + std::ptrdiff_t(at),
                     micro.begin() + std::ptrdiff_t(end));
      w.partial = int64_t(w.micro.size()) < K_;
      e.windows.push_back(std::move(w));
      at = end;
    }
    return e;
  }

  // Whether the boundary block calls scheduler.step().
  bool boundary_schedules() const {
    return !b_.scheduler_per_micro_step && !b_.scheduler_per_epoch;
  }

  // 1/den is the weight of each item loss of one rank's micro-batch shard.
  int64_t weight_den(const Window& w, int64_t shard_items) const {
    const int64_t R = int64_t(w.micro.front().shards.size());
    const int64_t Kw = int64_t(w.micro.size());
    // ramp-normalization-stale: `loss / K_0` in the epochs whose K is not
    // K_0 (inert while K never changes).
    if (b_.normalization_stale_k && K_ != s_.batching.accumulation)
      return s_.batching.accumulation * shard_items * R;
    if (w.partial && b_.partial_scale_by_k) return K_ * shard_items * R;
    switch (b_.normalization) {
      case Normalization::window_items:
        return window_items_;
      case Normalization::micro_mean:
        return shard_items * R;
      case Normalization::micro_mean_over_window_micros:
        return Kw * shard_items * R;
      case Normalization::micro_mean_over_k:
        return K_ * shard_items * R;
    }
    return window_items_;
  }

  void event(EventKind kind, int64_t micro, auto&&... set) {
    if (!opt_.record_events) return;
    Event ev;
    ev.epoch = epoch_;
    ev.step = c_.optimizer_steps;
    ev.micro = micro;
    ev.kind = kind;
    (set(ev), ...);
    run_.events.push_back(ev);
  }

  void zero_grad(int64_t micro) {
    e_.zero_grad();
    event(EventKind::zero_grad, micro);
  }

  // clip_grad_norm_: coef = c / (norm + 1e-6), clamped to 1, in the
  // engine's arithmetic (float32 tensors in PyTorch).
  // An engine that keeps the factor symbolic (the contract tier's
  // coefficient engine) clips itself.
  void clip(int64_t micro) {
    Real norm;
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

  void optimizer_step(int64_t micro) {
    const double lr = current_lr();
    StepRecord<Real> rec;
    rec.step = c_.optimizer_steps;
    rec.epoch = epoch_;
    rec.window = c_.windows;
    rec.lr = lr;
    rec.grad_norm = static_cast<double>(e_.grad_norm());
    if (opt_.record_values) rec.grad = e_.state().grads;
    if (before_step_) before_step_(rec.step, e_);
    e_.optimizer_step(s_.optimizer, lr);
    event(EventKind::optimizer_step, micro, [&](Event& ev) { ev.lr = lr; });
    ++c_.optimizer_steps;
    if (opt_.record_values) rec.param = e_.state().params;
    run_.steps.push_back(std::move(rec));
    if (after_step_) after_step_(run_.steps.back().step, e_);
  }

  void scheduler_step(int64_t micro) {
    ++c_.scheduler_steps;
    event(EventKind::scheduler_step, micro,
          [&](Event& ev) { ev.lr = current_lr(); });
  }

  // The end of a window: step, schedule and zero as the behaviour says.
  void boundary(bool steps_at_boundary, bool last_of_epoch,
                int64_t epoch_micro_steps) {
    const bool clipping = s_.clip.enabled;
    if (b_.seed_002_loop) {
      // `if (batch_idx + 1) % K == 0:` after the loop, once per epoch.
      if (last_of_epoch && epoch_micro_steps % K_ == 0 && !done()) {
        if (boundary_schedules() && b_.scheduler_before_optimizer)
          scheduler_step(-1);
        if (clipping && !b_.clip_per_micro_step) clip(-1);
        optimizer_step(-1);
        if (boundary_schedules() && !b_.scheduler_before_optimizer)
          scheduler_step(-1);
        zero_grad(-1);
      }
    } else if (!steps_at_boundary) {
      if (b_.partial == PartialWindow::drop) zero_grad(-1);
      // leak: neither step nor zero_grad; the sum carries on.
    } else {
      if (boundary_schedules() && b_.scheduler_before_optimizer)
        scheduler_step(-1);
      if (!b_.step_every_micro_step && !done()) {
        if (clipping && !b_.clip_per_micro_step) clip(-1);
        optimizer_step(-1);
      }
      if (boundary_schedules() && !b_.scheduler_before_optimizer)
        scheduler_step(-1);
      if (b_.zero_grad == ZeroGradTiming::after_step) zero_grad(-1);
    }
  }

  void window(const Window& w, int64_t epoch, bool last_of_epoch,
              int64_t epoch_micro_steps) {
    epoch_ = epoch;
    const int64_t Kw = int64_t(w.micro.size());
    const bool steps_at_boundary =
        !b_.seed_002_loop && !(w.partial && b_.partial != PartialWindow::step);
    const bool clipping = s_.clip.enabled;
    double loss_sum = 0;
    int64_t loss_items = 0;
    // N_w in the engine's items (tokens for token losses), counted before
    // the first backward.
    window_items_ = 0;
    for (const MicroBatch& m : w.micro)
      for (const auto& shard : m.shards) window_items_ += e_.items(shard);
    if constexpr (requires { e_.set_epoch(epoch); }) e_.set_epoch(epoch);

    for (int64_t k = 0; k < Kw; ++k) {
      if (b_.seed_002_loop || b_.zero_grad == ZeroGradTiming::every_micro_step)
        zero_grad(k);
      for (const auto& shard : w.micro[size_t(k)].shards) {
        if (shard.empty()) continue;
        const int64_t items = e_.items(shard);
        const double loss = static_cast<double>(
            e_.forward_backward(shard, weight_den(w, items)));
        loss_sum += loss;
        loss_items += items;
        event(EventKind::forward_backward, k, [&](Event& ev) {
          ev.samples = int64_t(shard.size());
          ev.sample_ids = shard;
          if (s_.model.kind == ModelKind::token) ev.tokens = items;
          ev.loss = loss / double(items);
        });
      }
      if (s_.optimizer.l2_in_loss != 0.0)
        e_.add_l2(s_.optimizer.l2_in_loss, b_.l2_unnormalized ? 1 : Kw);
      if (clipping && b_.clip_per_micro_step) clip(k);
      if (b_.step_every_micro_step && steps_at_boundary && !done()) {
        if (clipping && !b_.clip_per_micro_step) clip(k);
        optimizer_step(k);
      }
      // The boundary's optimizer.step() precedes the micro-step's
      // scheduler.step() (scheduler-per-micro-step: step t uses S(tK+K-1)).
      if (k + 1 == Kw)
        boundary(steps_at_boundary, last_of_epoch, epoch_micro_steps);
      if (b_.scheduler_per_micro_step) scheduler_step(k);
    }

    WindowRecord<Real> rec;
    rec.window = c_.windows;
    rec.epoch = epoch;
    rec.steps = c_.optimizer_steps;
    rec.loss = loss_items ? loss_sum / double(loss_items) : kNaN;
    if (opt_.record_values) rec.param = e_.state().params;
    run_.windows.push_back(std::move(rec));
    ++c_.windows;
  }

  E& e_;
  const Scenario& s_;
  Behavior b_;
  double base_lr_;
  TrainerOptions opt_;
  ScheduleSpec schedule_;
  TrainerCounters c_;
  Run<Real> run_;
  StepHook before_step_, after_step_;
  int64_t K_ = 1;
  int64_t epoch_ = 0;
  int64_t window_items_ = 0;
};

}  // namespace accumcheck
