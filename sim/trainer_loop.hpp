// Trainer<Engine>, the one training loop (sim/trainer.hpp says what it
// does, pitfall by pitfall): the class, its run and window loops and the
// loss weights.  The step block and the ranks are defined beside it
// (sim/trainer_step.hpp, sim/trainer_ranks.hpp); include sim/trainer.hpp,
// which holds them all.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "sim/engine.hpp"
#include "sim/k_schedule.hpp"
#include "sim/limits.hpp"
#include "sim/lr_schedule.hpp"
#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/run.hpp"
#include "sim/scenario.hpp"
#include "sim/trainer_draw.hpp"
#include "sim/trainer_options.hpp"

namespace accumcheck {

template <Engine E>
class Trainer {
 public:
  using Real = typename E::Real;

  Trainer(E& engine, const Scenario& scenario, Behavior behavior,
          double base_lr, TrainerOptions options = {})
      : e_(engine),
        s_(scenario),
        b_(behavior),
        // lr-scaled-by-k: the optimizer was built with lr * K.
        base_lr_(behavior.lr_times_k
                     ? base_lr * double(scenario.batching.accumulation)
                     : base_lr),
        opt_(options),
        scaling_(scenario.precision.loss_scaling ||
                 !options.forced_scale_exp.empty()),
        schedule_(
            behavior.schedule_horizon_in_micro_steps
                ? stretched(
                      resolved_schedule(scenario, behavior.horizon_initial_k),
                      scenario.batching.accumulation)
                : resolved_schedule(scenario, behavior.horizon_initial_k)) {
    // The engine's gradient buffer: the scenario's, or bf16 where the
    // low-precision-grad-buffer trainer accumulates in its bf16 .grad.
    const GradBuffer buf =
        behavior.low_precision_grad_buffer &&
                scenario.precision.grad_buffer == GradBuffer::fp32
            ? GradBuffer::bf16
            : scenario.precision.grad_buffer;
    if constexpr (requires { engine.set_grad_buffer(buf); })
      engine.set_grad_buffer(buf);
  }

  // Runs every epoch of `plan` from the engine's current state (every
  // rank starts from it, as DDP broadcasts rank 0's parameters).  The
  // engine is left holding rank 0.
  Run<Real> run(const Plan& plan, std::string name) {
    run_ = Run<Real>{};
    run_.name = std::move(name);
    backward_ = since_step_ = 0;
    micro_before_epoch_ = 0;
    buffered_.clear();
    buffered_epochs_.clear();
    floor_budget_ = INT64_MAX;
    // schedule-horizon-in-micro-steps: the horizon in the micro-batches of
    // the plan's real windows (an epoch's partial last window included).
    if (b_.schedule_horizon_in_micro_steps && plan.epoch_count() > 0)
      schedule_ =
          stretched(resolved_schedule(s_, b_.horizon_initial_k),
                    s_.batching.accumulation, plan.epoch(0).micro_steps());
    init_ranks(plan.ranks);
    init_state_beyond_gradients(true);
    // A lazy plan builds each epoch here, when the loop reaches it.
    plan.visit([&](int64_t ep, const EpochPlan& planned) {
      // The pitfalls that draw or cut windows differently get their own
      // copy of the epoch (drawn_epoch); every other loop walks the plan's.
      K_ = planned.accumulation;  // K may change from epoch to epoch
      EpochPlan own;
      const bool redrawn = draws_own_windows(b_);
      bool unfinished = false;  // last-fetch-sized-in-samples cut the epoch
      if (redrawn)
        own = drawn_epoch(planned, b_, s_.batching.micro_batch, K_,
                          micro_before_epoch_, unfinished);
      // window-buffer-across-epochs: the buffer's leftover first, cut in
      // K; the epoch's end steps nothing (no window waits for it).
      micro_epochs_.clear();
      if (b_.buffer_across_epochs) {
        own = buffered_epoch(own, K_, ep, buffered_, buffered_epochs_,
                             micro_epochs_);
        unfinished = false;
      }
      // window-sum-across-epochs: the leftover joins the epoch's first
      // full window; the run's last leftover runs unstepped at its end.
      if (b_.sum_across_epochs) {
        const bool last_epoch = ep + 1 == plan.epoch_count();
        own = joined_epoch(own, ep, last_epoch, buffered_, buffered_epochs_,
                           micro_epochs_);
        unfinished = last_epoch;
      }
      const EpochPlan& epoch = redrawn ? own : planned;
      if (b_.items_per_fetch_group) fetch_items(epoch);
      micro_before_epoch_ += epoch.micro_steps();
      // step-budget-drops-micro-batches: epochs x max(1, floor(M / K)),
      // counted before training (a budget past int64 never stops).
      if (ep == 0 && b_.stop_at_floor_budget)
        floor_budget_ =
            checked_mul(plan.epoch_count(),
                        std::max<int64_t>(
                            1, planned.micro_steps() /
                                   std::max<int64_t>(1, planned.accumulation)))
                .value_or(INT64_MAX);
      // ... and the same budget is the horizon the trainer builds its
      // scheduler with (num_training_steps = max_steps): the lr decays
      // over the budget, not over the steps the data makes.
      if (ep == 0 && b_.stop_at_floor_budget && floor_budget_ != INT64_MAX) {
        const ScheduleSpec sc = with_horizon(
            resolved_schedule(s_, b_.horizon_initial_k), floor_budget_);
        schedule_ =
            b_.schedule_horizon_in_micro_steps
                ? stretched(sc, s_.batching.accumulation, planned.micro_steps())
                : sc;
      }
      // max_train_steps as run_clm_no_trainer computes it before training
      // (only that loop stops at it; a budget past int64 never stops).
      if (ep == 0 && b_.stop_at_planned_steps)
        planned_steps_ =
            checked_mul(plan.epoch_count(),
                        (planned.micro_steps() + planned.accumulation - 1) /
                            std::max<int64_t>(1, planned.accumulation))
                .value_or(INT64_MAX);
      window_offset_ = 0;
      for (size_t w = 0; w < epoch.windows.size() && !stop(); ++w) {
        // The epoch's last window, if the loop's own cut left it partial,
        // waits for an epoch end that never comes.
        const bool last = w + 1 == epoch.windows.size();
        window(epoch.windows[w], ep, last, epoch.micro_steps(),
               unfinished && last && epoch.windows[w].partial);
        window_offset_ += int64_t(epoch.windows[w].micro.size());
        // window-boundary-off-by-one-max-steps: `if completed_steps >=
        // max_train_steps: break` (checked after every micro-step; the
        // count moves only at a window's end).
        if (b_.stop_at_planned_steps && c_.optimizer_steps >= planned_steps_)
          break;
      }
      if (b_.scheduler_per_epoch && !epoch.windows.empty()) scheduler_step(-1);
      return !stop();
    });
    use_rank(0);
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
    backward_ = since_step_ = 0;
    K_ = K;
    c_ = counters;
    init_ranks(int64_t(w.micro.front().shards.size()));
    init_state_beyond_gradients(false);
    // One window alone: its fetch is itself, its micro-batches drawn in
    // its epoch.
    fetch_items_.clear();
    micro_epochs_.clear();
    window_offset_ = 0;
    window(w, 0, last_of_epoch, epoch_micro_steps);
    use_rank(0);
    return std::move(run_);
  }

  // Teacher forcing along an external trajectory (certify): called with
  // the optimizer step's index and the engine, `before_step` after the
  // accumulated gradient is recorded and before optimizer.step() (it may
  // replace the gradient with the trace's), `after_step` after the new
  // parameters are recorded (it may reset them to the trace's).  With
  // R > 1 each hook is called once per rank, the engine holding that rank
  // (rank() says which).
  using StepHook = std::function<void(int64_t step, E& engine)>;
  void set_step_hooks(StepHook before_step, StepHook after_step) {
    before_step_ = std::move(before_step);
    after_step_ = std::move(after_step);
  }

  const TrainerCounters& counters() const { return c_; }
  // The EMA of the parameters (empty without [ema] until the first run).
  const std::vector<Real>& ema() const { return ema_; }
  void set_ema(std::vector<Real> ema) { ema_ = std::move(ema); }
  // The loss scale now (1 without loss scaling).
  double loss_scale() const {
    return scaling_ ? std::ldexp(1.0, int(c_.scale_exp)) : 1.0;
  }
  int64_t rank() const { return rank_; }
  double current_lr() const {
    return base_lr_ * lr_multiplier(schedule_, c_.scheduler_steps);
  }

 private:
  bool done() const {
    return opt_.max_steps >= 0 && c_.optimizer_steps >= opt_.max_steps;
  }
  bool stop() const {
    return done() ||
           (opt_.max_windows >= 0 && c_.windows >= opt_.max_windows) ||
           (b_.stop_at_floor_budget && c_.optimizer_steps >= floor_budget_);
  }

  // Whether the boundary block calls scheduler.step().
  bool boundary_schedules() const {
    return !b_.scheduler_per_micro_step && !b_.scheduler_per_epoch;
  }

  // items-counted-per-fetch-group: each fetch's items (every rank's, and
  // each rank's own) of the epoch as drawn, fetches of K micro-batches
  // from its start.
  void fetch_items(const EpochPlan& epoch) {
    fetch_items_.clear();
    fetch_rank_items_.clear();
    int64_t i = 0;
    for (const Window& w : epoch.windows)
      for (const MicroBatch& m : w.micro) {
        if (i++ % std::max<int64_t>(K_, 1) == 0) {
          fetch_items_.push_back(0);
          fetch_rank_items_.emplace_back(m.shards.size(), 0);
        }
        for (size_t r = 0; r < m.shards.size(); ++r) {
          const int64_t n = counted_items(m.shards[r]);
          fetch_items_.back() += n;
          fetch_rank_items_.back()[r] += n;
        }
      }
  }

  // The items a loop counts of a shard: the engine's (samples, or
  // loss-bearing tokens); for token-count-unshifted-labels those over the
  // unshifted labels: the engine's own count where it has one (the
  // contract tier's, recorded: a prompt masked with -100 leaves position 0
  // uncounted), else each sequence's position 0 too.
  int64_t counted_items(const std::vector<int64_t>& shard) const {
    if (!b_.count_unshifted_labels) return e_.items(shard);
    if constexpr (requires { e_.unshifted_items(shard); })
      return e_.unshifted_items(shard);
    return e_.items(shard) + int64_t(shard.size());
  }

  // The weight of each item loss of rank r's micro-batch shard.  DDP then
  // averages the R ranks' gradients, so a rank weighing its items R/N_w
  // gives each item 1/N_w; the per-rank means are averaged as they are.
  LossWeight weight(const Window& w, int64_t r, int64_t shard_items) const {
    LossWeight lw = loop_weight(w, r, shard_items);
    // loss-divided-by-k-twice: the framework's own / K on top of the
    // loop's weight (exact: the weight stays num/integer; K and the items
    // are bounded by sim/limits, as in micro_mean_over_k's K*b_k).
    if (b_.loss_divided_by_k_again) lw.den *= K_;
    return lw;
  }

  // The weight the user's loop gives (before a framework's extra / K).
  LossWeight loop_weight(const Window& w, int64_t r,
                         int64_t shard_items) const {
    // window-counter-across-epochs: the loop's window is K micro-batches
    // of the run (an epoch's leftover and the next epoch's head are parts
    // of one) unless the epoch is no longer than K.
    const int64_t Kw = b_.windows_across_epochs && epoch_micro_steps_ > K_
                           ? K_
                           : int64_t(w.micro.size());
    // ramp-normalization-stale: `loss / K_0` in the epochs whose K is not
    // K_0 (inert while K never changes).
    if (b_.normalization_stale_k && K_ != s_.batching.accumulation)
      return {s_.batching.accumulation * shard_items};
    if (w.partial && b_.partial_scale_by_k) return {K_ * shard_items};
    switch (b_.normalization) {
      case Normalization::window_items:
        return {R_, window_items_};
      case Normalization::micro_mean:
        return {shard_items};
      case Normalization::micro_mean_over_window_micros:
        return {Kw * shard_items};
      case Normalization::micro_mean_over_k:
        return {K_ * shard_items};
      case Normalization::micro_sum_over_k:
        return {K_};
      case Normalization::rank_window_items:
        return {rank_items_[size_t(r)]};
    }
    return {R_, window_items_};
  }

  void event(EventKind kind, int64_t micro, auto&&... set) {
    if (!opt_.record_events) return;
    Event ev;
    ev.epoch = epoch_;
    ev.step = c_.optimizer_steps;
    ev.micro = micro;
    ev.kind = kind;
    ev.rank = rank_;
    (set(ev), ...);
    run_.events.push_back(ev);
  }

  // Ranks (sim/trainer_ranks.hpp): how many, which one the engine holds,
  // DDP's all-reduce, zero_grad on the rank held.
  void init_ranks(int64_t R);
  void use_rank(int64_t r);
  void all_reduce(int64_t micro);
  // The engine's state into rank r's slot, and rank r's slot into the
  // engine: exchanged where the engine can (ExposesTensors: no tensor
  // copied; the side given away is stale until the other call), copied
  // elsewhere.
  void stash_state(int64_t r) {
    if constexpr (ExposesTensors<E>)
      e_.swap_state(rank_state_[size_t(r)]);
    else
      rank_state_[size_t(r)] = e_.state();
  }
  void load_state(int64_t r) {
    if constexpr (ExposesTensors<E>)
      e_.swap_state(rank_state_[size_t(r)]);
    else
      e_.set_state(rank_state_[size_t(r)]);
  }
  void zero_grad(int64_t micro);
  // f(r) on every rank r in order, the engine holding it.
  void each_rank(auto&& f) {
    for (int64_t r = 0; r < R_; ++r) {
      use_rank(r);
      f(r);
    }
  }

  // A copy of the engine's gradient / parameters (rank the engine holds).
  std::vector<Real> grads_copy() {
    if constexpr (ExposesTensors<E>)
      return e_.grads();
    else
      return e_.state().grads;
  }
  std::vector<Real> params_copy() {
    if constexpr (ExposesTensors<E>)
      return e_.params();
    else
      return e_.state().params;
  }

  // The step block (sim/trainer_step.hpp): loss scaling, the EMA, the
  // optimizer state, the clip, optimizer.step() and scheduler.step().
  void init_state_beyond_gradients(bool fresh_run);
  LossWeight scaled(LossWeight w) const;
  bool grads_finite();
  bool unscale_all(int64_t micro);
  void scaler_update(int64_t micro, bool found_inf);
  void ema_update(int64_t micro);
  void advance_optimizer_state();
  bool step_block(int64_t micro, bool clip_here);
  bool clips_at_step() const;
  void clip(int64_t micro);
  void clip_sharded(int64_t micro);
  void optimizer_step(int64_t micro);
  void scheduler_step(int64_t micro);

  // The end of a window: step, schedule and zero as the behaviour says.
  // A step the scaler skipped is not followed by scheduler.step()
  // (accelerate's `if not optimizer.step_was_skipped`) unless the
  // trainer is skipped-step-advances-scheduler.
  void boundary(bool steps_at_boundary, bool last_of_epoch,
                int64_t epoch_micro_steps) {
    auto zero_all = [&] { each_rank([&](int64_t) { zero_grad(-1); }); };
    // A schedule's frequency f (every f-th optimizer step, counted
    // across epochs); scheduler-frequency-in-micro-batches: the steps
    // whose window ends on the epoch's micro-batch numbered a multiple of
    // f (from 1).
    const int64_t f = schedule_.frequency;
    const bool due = f <= 1 || (b_.frequency_in_micro_batches
                                    ? micro_in_epoch_ % f == 0
                                    : (c_.optimizer_steps + 1) % f == 0);
    auto schedules_after = [&](bool stepped) {
      return due && boundary_schedules() && !b_.scheduler_before_optimizer &&
             (stepped || b_.skipped_step_advances_scheduler);
    };
    if (b_.seed_002_loop) {
      // `if (batch_idx + 1) % K == 0:` after the loop, once per epoch.
      if (last_of_epoch && epoch_micro_steps % K_ == 0 && !done()) {
        if (due && boundary_schedules() && b_.scheduler_before_optimizer)
          scheduler_step(-1);
        const bool stepped = step_block(-1, clips_at_step());
        if (schedules_after(stepped)) scheduler_step(-1);
        zero_all();
      }
    } else if (!steps_at_boundary) {
      if (b_.partial == PartialWindow::drop) zero_all();
      // leak: neither step nor zero_grad; the sum carries on.
    } else {
      if (due && boundary_schedules() && b_.scheduler_before_optimizer)
        scheduler_step(-1);
      bool stepped = true;
      if (!b_.step_every_micro_step && !done())
        stepped = step_block(-1, clips_at_step());
      if (schedules_after(stepped)) scheduler_step(-1);
      if (b_.zero_grad == ZeroGradTiming::after_step) zero_all();
    }
  }

  // `unfinished`: the epoch's end is never reached in this window
  // (last-fetch-sized-in-samples): not stepped, zeroed only by
  // partial-cycle-drop's end of epoch.
  void window(const Window& w, int64_t epoch, bool last_of_epoch,
              int64_t epoch_micro_steps, bool unfinished = false) {
    epoch_ = epoch;
    epoch_micro_steps_ = epoch_micro_steps;
    const int64_t Kw = int64_t(w.micro.size());
    const bool steps_at_boundary =
        !b_.seed_002_loop && !unfinished &&
        !(w.partial && b_.partial != PartialWindow::step);
    const bool clipping = s_.clip.enabled;
    double loss_sum = 0;
    int64_t loss_items = 0;
    // N_w in the engine's items (tokens for token losses), over every
    // rank, counted before the first backward; and each rank's own.
    // token-count-unshifted-labels counts each sequence's position 0 too.
    window_items_ = 0;
    rank_items_.assign(size_t(R_), 0);
    for (const MicroBatch& m : w.micro)
      for (size_t r = 0; r < m.shards.size(); ++r) {
        const int64_t n = counted_items(m.shards[r]);
        window_items_ += n;
        rank_items_[r] += n;
      }
    // DDP all-reduces at the last micro-step of a window that is stepped
    // (no_sync before it); seed 002's loop steps once, at the epoch's end.
    const bool syncs_at_end =
        steps_at_boundary || (b_.seed_002_loop && last_of_epoch);
    // end-of-loader-syncs-every-micro-batch: the epoch's last window is
    // synced and stepped after each of its micro-steps.
    const bool steps_each =
        b_.end_of_loader_steps_every_micro_step && last_of_epoch;

    for (int64_t k = 0; k < Kw; ++k) {
      // items-counted-per-fetch-group: micro-batch k's fetch's count.
      if (b_.items_per_fetch_group && !fetch_items_.empty()) {
        const size_t f = size_t((window_offset_ + k) / K_);
        window_items_ = fetch_items_.at(f);
        rank_items_ = fetch_rank_items_.at(f);
      }
      // The epoch micro-batch k was drawn in (window-buffer-across-epochs
      // runs an earlier epoch's leftover): its events' and its forward's.
      epoch_ = micro_epochs_.empty()
                   ? epoch
                   : micro_epochs_.at(size_t(window_offset_ + k));
      const int64_t b = backward_;  // rank 0's backward pass of this micro-step
      each_rank([&](int64_t r) {
        if constexpr (requires { e_.set_epoch(epoch_); }) e_.set_epoch(epoch_);
        if (b_.seed_002_loop ||
            b_.zero_grad == ZeroGradTiming::every_micro_step)
          zero_grad(k);
        // accumulator-rescaled: buf = 2*buf + g.
        if (b_.accumulator_rescaled) e_.scale_grads(Real(2));
        const auto& shard = w.micro[size_t(k)].shards[size_t(r)];
        if (!shard.empty()) {
          if (size_t(b) < opt_.forced_scale_exp.size())
            c_.scale_exp = opt_.forced_scale_exp[size_t(b)];
          const int64_t items = e_.items(shard);
          const double loss = static_cast<double>(
              e_.forward_backward(shard, scaled(weight(w, r, items))));
          loss_sum += loss;
          loss_items += items;
          event(EventKind::forward_backward, k, [&](Event& ev) {
            ev.samples = int64_t(shard.size());
            ev.sample_ids = shard;
            if (s_.model.kind == ModelKind::token) ev.tokens = items;
            ev.loss = loss / double(items);
            if (scaling_) ev.loss_scale = loss_scale();
          });
          if (r == 0) {
            ++backward_;
            ++since_step_;
          }
          if (injected_overflow(k)) inf_pending_ = true;
        }
        if (s_.optimizer.l2_in_loss != 0.0)
          // The L2 term is part of the loss: scaled by S like the rest.
          e_.add_l2(s_.optimizer.l2_in_loss * loss_scale(),
                    b_.l2_unnormalized ? 1 : Kw);
      });
      // ddp-clip-before-all-reduce: each rank clips its own local gradient
      // before the window's all-reduce.
      if (clipping && b_.clip_before_all_reduce && R_ > 1 &&
          (k + 1 == Kw || steps_each))
        each_rank([&](int64_t) { clip(k); });
      if (b_.sync == Sync::every_micro_step ||
          (b_.sync == Sync::window_end && (k + 1 == Kw || steps_each) &&
           syncs_at_end))
        all_reduce(k);
      if (clipping && b_.clip_per_micro_step)
        each_rank([&](int64_t) { clip(k); });
      if (k + 1 < Kw && !steps_each) {  // the micro-steps that do not step
        if (scaling_ && b_.scaler_update_every_micro_step)
          scaler_update(k, unscale_all(k));
        if (s_.ema.enabled && b_.ema_every_micro_step) ema_update(k);
        if (b_.optimizer_state_every_micro_step) advance_optimizer_state();
      }
      // scheduler-per-micro-step with scheduler-before-optimizer: the
      // micro-step's scheduler.step() right after its backward, before
      // any optimizer.step() (step t uses S(tK+K)).
      const bool schedules_first =
          b_.scheduler_per_micro_step && b_.scheduler_before_optimizer;
      if (schedules_first) scheduler_step(k);
      if (b_.step_every_micro_step && steps_at_boundary && !done())
        step_block(k, clips_at_step());
      // The boundary's optimizer.step() precedes the micro-step's
      // scheduler.step() (scheduler-per-micro-step: step t uses S(tK+K-1)).
      if (k + 1 == Kw || steps_each) {
        epoch_ = epoch;  // the step is the window's epoch's
        micro_in_epoch_ = window_offset_ + k + 1;
        boundary(steps_at_boundary, last_of_epoch, epoch_micro_steps);
      }
      if (b_.scheduler_per_micro_step && !schedules_first) scheduler_step(k);
    }
    use_rank(0);

    WindowRecord<Real> rec;
    rec.window = c_.windows;
    rec.epoch = epoch;
    rec.steps = c_.optimizer_steps;
    rec.loss = loss_items ? loss_sum / double(loss_items) : kNaN;
    if (opt_.record_values) rec.param = params_copy();
    run_.windows.push_back(std::move(rec));
    ++c_.windows;
  }

  // precision.overflow names (this window, micro-step k).
  bool injected_overflow(int64_t k) const {
    for (const auto& [w, m] : s_.precision.overflow)
      if (w == c_.windows && m == k) return true;
    return false;
  }

  E& e_;
  const Scenario& s_;
  Behavior b_;
  double base_lr_;
  TrainerOptions opt_;
  bool scaling_ = false;  // GradScaler on (precision.loss_scale)
  // Rank 0's backward passes in this run, and since its last optimizer
  // step (or skipped window): Run::skipped and Run::ema say where.
  int64_t backward_ = 0, since_step_ = 0;
  bool inf_pending_ = false;  // an injected overflow since zero_grad
  std::vector<Real> ema_;     // the EMA of the parameters ([ema])
  ScheduleSpec schedule_;
  TrainerCounters c_;
  Run<Real> run_;
  StepHook before_step_, after_step_;
  int64_t K_ = 1;
  int64_t planned_steps_ = 0;  // max_train_steps (stop_at_planned_steps)
  // step-budget-drops-micro-batches' budget; window-counter-across-epochs'
  // micro-batches drawn in the epochs before this one.
  int64_t floor_budget_ = INT64_MAX;
  int64_t micro_before_epoch_ = 0;
  // window-buffer-across-epochs: the micro-batches the buffer holds, not
  // yet run (an epoch's leftover, waiting for the next epoch's).
  std::vector<MicroBatch> buffered_;
  std::vector<int64_t> buffered_epochs_;  // the epoch each was drawn in
  // The epoch each micro-batch of this epoch's windows was drawn in, in
  // order (empty: all in this one).
  std::vector<int64_t> micro_epochs_;
  int64_t epoch_micro_steps_ = 0;  // the micro-steps of the window's epoch
  // items-counted-per-fetch-group: the epoch's fetches' items (all ranks;
  // per rank), and the window's first micro-batch's place in its epoch.
  std::vector<int64_t> fetch_items_;
  std::vector<std::vector<int64_t>> fetch_rank_items_;
  int64_t window_offset_ = 0;
  // The micro-batch (from 1, in its epoch) a boundary ends on.
  int64_t micro_in_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t window_items_ = 0;
  // Ranks: R, the rank being run, the rank the engine holds, the others'
  // states (R > 1), each rank's window items.
  int64_t R_ = 1, rank_ = 0, active_ = 0;
  std::vector<EngineState<Real>> rank_state_;
  std::vector<int64_t> rank_items_;
};

}  // namespace accumcheck
