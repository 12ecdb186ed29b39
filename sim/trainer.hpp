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
//   [scheduler.step if scheduler-per-micro-step]   (after the boundary's step;
//    with scheduler-before-optimizer too: right after the backward, before
//    any optimizer.step)
// and at the window's end the boundary block (step, scheduler, zero_grad)
// as the behaviour says (scheduler-before-optimizer: scheduler, step,
// zero_grad; scheduler-per-epoch: no scheduler there, one scheduler.step()
// after each epoch's last window).
// Loss scaling ([precision] loss_scale = "dynamic", PyTorch's GradScaler
// as the docs' accumulation recipe uses it): every backward's loss weight
// is multiplied by the scale S = 2^e (exact; certify forces the trainer's
// own e per backward pass: TrainerOptions::forced_scale_exp); the window's
// step block is
//   [clip if clip-before-unscale] unscale_ (grads *= 2^-e; found_inf if
//   any rank holds an inf/NaN or an injected overflow) [clip]
//   optimizer.step() unless found_inf; scaler.update() (found_inf:
//   e += backoff, else after growth_interval clean updates e += growth);
//   [EMA update after a step]
// then scheduler.step() unless the step was skipped
// (skipped-step-advances-scheduler: always), zero_grad.  On the
// micro-steps that do not step: [accumulator-rescaled: grads *= 2 before
// each backward] [unscale_ + update if scaler-update-every-micro-step]
// [EMA update if ema-every-micro-step] [t += 1 and AdamW's decay if
// optimizer-state-every-micro-step].  The engine's gradient buffer
// (bf16/fp16/fp32) is set once, from [precision] grad_buffer or bf16 for
// low-precision-grad-buffer.
//
// end-of-loader-syncs-every-micro-batch runs the boundary block (with
// its all-reduce) after every micro-step of each epoch's last window;
// loss-divided-by-k-twice divides every loss weight by K once more.
// The windows an epoch is cut into are the plan's, except where a pitfall
// draws or cuts them differently (drawn()): skip-short-micro-batch drops
// the epoch's short last micro-batch, window-boundary-off-by-one cuts
// [0], [1..K], [K+1..2K], ... with the leftover a partial window
// (window-boundary-off-by-one-max-steps: the same cut, the partial window
// stepped, and every epoch left after the window whose step reaches
// max_train_steps = epochs x ceil(micro-steps of epoch 0 / K));
// window-counter-across-epochs cuts where the run's micro-batch count is a
// multiple of K, an epoch's leftover leaked into the next epoch;
// step-budget-drops-micro-batches stops the run once the optimizer steps
// reach epochs x max(1, floor(micro-steps of epoch 0 / K));
// last-fetch-sized-in-samples draws only N mod K micro-batches (N the
// epoch's samples) of the epoch's last fetch, the drawn rest of a window
// the epoch never finishes neither stepped nor zeroed.
// items-counted-per-fetch-group divides each micro-batch by the items of
// its fetch (the epoch's K-slices from its start, as drawn) instead of its
// window's.
//
// K may change from epoch to epoch (EpochPlan::accumulation,
// sim/k_schedule.hpp): the loop reads K of the epoch it is in.  The ramp
// pitfalls keep correct's call order and change values only:
// ramp-normalization-stale weighs by the first epoch's K,
// ramp-schedule-horizon-fixed resolves a total = "auto" horizon with it.
//
// Ranks (R > 1, DDP): every rank is a full replica (parameters, .grad,
// optimizer state, buffers), as a DDP process is.  The one engine holds
// one rank at a time; the trainer keeps the others' EngineState and swaps
// (use_rank), so engines stay single-replica and ranks may diverge
// (ddp-no-sync-everywhere).  Per micro-step every rank runs its shard's
// backward with weight R/N_w (N_w counted over ALL ranks before the first
// backward); DDP's all-reduce (all_reduce) replaces every rank's .grad by
//   sum_{r = 0..R-1} fl(g_r * fl(1/R))        (PyTorch's reducer: each
// gradient multiplied by 1/world_size into the bucket, then summed), in
// rank order, at the window's last micro-step only (no_sync elsewhere) as
// `Behavior::sync` says.  zero_grad, clip, optimizer.step and
// scheduler.step run on every rank and are recorded per rank.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/engine.hpp"
#include "sim/errors.hpp"
#include "sim/k_schedule.hpp"
#include "sim/limits.hpp"
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
  // GradScaler's state (loss scaling only): the scale is 2^scale_exp
  // (kNoScale: not started, the scenario's init_scale), and the clean
  // steps since the scale last changed.
  static constexpr int64_t kNoScale = INT64_MIN;
  int64_t scale_exp = kNoScale;
  int64_t growth_tracker = 0;
  int64_t skipped_steps = 0;  // steps the scaler skipped (inf/NaN)
};

struct TrainerOptions {
  bool record_values = true;  // keep grads/params per step and window
  bool record_events = true;
  int64_t max_steps = -1;  // stop after this many optimizer steps
  // Stop after this many windows (-1: none), so that a run which stops
  // stepping (a pitfall that never steps) ends too: run_experiment() sets
  // it to max_steps, the windows of the large-batch reference.
  int64_t max_windows = -1;
  // Teacher forcing of the loss scale (certify): the exponent e of the
  // scale 2^e of the backward passes of micro-step b (rank 0's backward
  // passes, 0-based over the run: every rank's pass of that micro-step) is
  // forced_scale_exp[b], the scale the trainer's own scaler used, as the
  // trace records it.  Non-empty turns loss scaling on whatever the
  // scenario says; the scaler still updates (its inf/NaN decisions, its
  // events), and each backward overrides its scale.  Beyond the last
  // entry the scaler's own scale is used.
  std::vector<int64_t> forced_scale_exp;
  // Teacher forcing of the scaler's skips (certify): the window whose
  // step_block() runs after backward pass count b (rank 0's, 0-based over
  // the run: Run::skipped's `backward`) is skipped when b is in
  // forced_skip (sorted), as the trace records that the trainer's scaler
  // found an inf/NaN there (an overflow the oracle, which holds no float16
  // or float32 range, cannot reproduce); a window the engine itself finds
  // overflowing is skipped too.
  std::vector<int64_t> forced_skip;

  // Neither values nor events recorded (the contract tier's predictions).
  static TrainerOptions unrecorded() {
    TrainerOptions o;
    o.record_values = false;
    o.record_events = false;
    return o;
  }
  // Events only (the contract tier's predictions under DDP count the
  // all-reduces each step holds).
  static TrainerOptions values_unrecorded() {
    TrainerOptions o;
    o.record_values = false;
    return o;
  }
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
      // copy of the epoch (drawn()); every other loop walks the plan's.
      K_ = planned.accumulation;  // K may change from epoch to epoch
      EpochPlan own;
      const bool redrawn = b_.skip_short_micro_batch || b_.window_off_by_one ||
                           b_.windows_across_epochs || b_.last_fetch_in_samples;
      bool unfinished = false;  // last-fetch-sized-in-samples cut the epoch
      if (redrawn) own = drawn(planned, unfinished);
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
    // One window alone: its fetch is itself.
    fetch_items_.clear();
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

  // The epoch's windows as this trainer draws and cuts them; `unfinished`:
  // last-fetch-sized-in-samples left the epoch's last micro-batches
  // undrawn, so its last window never reaches the epoch's end.
  EpochPlan drawn(const EpochPlan& planned, bool& unfinished) const {
    std::vector<MicroBatch> micro;
    int64_t samples = 0;  // the epoch's samples over all ranks
    for (const Window& w : planned.windows) {
      micro.insert(micro.end(), w.micro.begin(), w.micro.end());
      for (const MicroBatch& m : w.micro) samples += m.items();
    }
    if (b_.skip_short_micro_batch && !micro.empty()) {
      bool is_short = false;
      for (const auto& shard : micro.back().shards)
        is_short = is_short || int64_t(shard.size()) < s_.batching.micro_batch;
      if (is_short) micro.pop_back();
    }
    // The loader's length (the epoch's end is its last micro-batch).
    const int64_t M = int64_t(micro.size());
    unfinished = false;
    if (b_.last_fetch_in_samples && K_ > 0) {
      // Fetches of K, the last of r = N mod K (K when 0) micro-batches:
      // K * floor(M / K) + min(r, M mod K) drawn.
      const int64_t r = samples % K_ == 0 ? K_ : samples % K_;
      const int64_t keep = M / K_ * K_ + std::min(r, M % K_);
      unfinished = keep < M;
      micro.resize(size_t(keep));
    }
    EpochPlan e;
    e.accumulation = planned.accumulation;
    if (b_.windows_across_epochs) {
      // window-counter-across-epochs: a step where the run's micro-batch
      // count (micro_before_epoch_: earlier epochs') reaches a multiple of
      // K, or at the end of an epoch of M <= K (the loader's last
      // micro-batch: never, when it is not drawn); the rest of the epoch is
      // a partial window (leaked: neither stepped nor zeroed).
      const int64_t drawn_count = int64_t(micro.size());
      int64_t total = micro_before_epoch_;
      Window w;
      for (int64_t i = 0; i < drawn_count; ++i) {
        w.micro.push_back(micro[size_t(i)]);
        if (++total % K_ == 0 || (M <= K_ && i + 1 == M)) {
          w.partial = false;
          e.windows.push_back(std::move(w));
          w = Window{};
        }
      }
      if (!w.micro.empty()) {
        w.partial = true;
        e.windows.push_back(std::move(w));
      }
      return e;
    }
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

  // ------------------------------------------------------------ ranks

  void init_ranks(int64_t R) {
    R_ = std::max<int64_t>(R, 1);
    active_ = rank_ = 0;
    rank_state_.clear();
    if (R_ > 1) rank_state_.assign(size_t(R_), e_.state());
  }

  // Makes the engine hold rank r (saving the rank it held).
  void use_rank(int64_t r) {
    rank_ = r;
    if (R_ == 1 || r == active_) return;
    rank_state_[size_t(active_)] = e_.state();
    e_.set_state(rank_state_[size_t(r)]);
    // An engine whose gradient buffer is not numbers (the coefficient
    // engine) swaps it itself.
    if constexpr (requires { e_.hold_rank(r); }) e_.hold_rank(r);
    active_ = r;
  }

  void each_rank(auto&& f) {
    for (int64_t r = 0; r < R_; ++r) {
      use_rank(r);
      f(r);
    }
  }

  // DDP's all-reduce of .grad: every rank gets
  // sum_r fl(g_r * fl(1/R)), summed in rank order (a fixed order: the
  // device's bits do not depend on timing).
  void all_reduce(int64_t micro) {
    if (R_ == 1) return;
    if constexpr (requires { e_.average_ranks(R_); }) {
      e_.average_ranks(R_);  // exact coefficients: the order is moot
      event(EventKind::all_reduce, micro, [](Event& ev) { ev.rank = -1; });
      return;
    }
    rank_state_[size_t(active_)] = e_.state();
    const size_t P = rank_state_[0].grads.size();
    const Real inv = Real(1) / Real(R_);
    std::vector<Real> avg(P);
    for (size_t i = 0; i < P; ++i) {
      Real acc = rank_state_[0].grads[i] * inv;
      for (size_t r = 1; r < size_t(R_); ++r) {
        const Real t = rank_state_[r].grads[i] * inv;
        acc += t;
      }
      avg[i] = acc;
    }
    for (auto& st : rank_state_) st.grads = avg;
    e_.set_state(rank_state_[size_t(active_)]);
    event(EventKind::all_reduce, micro, [](Event& ev) { ev.rank = -1; });
  }

  // On the rank the engine holds.
  void zero_grad(int64_t micro) {
    e_.zero_grad();
    inf_pending_ = false;  // an injected overflow lives until zero_grad
    event(EventKind::zero_grad, micro);
  }

  // ------------------------------------- loss scaling, EMA, optimizer state

  // The scaler's starting scale; the EMA's copy of the parameters
  // (AveragedModel copies them when built; a teacher-forced window keeps
  // the EMA it was given, or starts one from the state).
  void init_state_beyond_gradients(bool fresh_run) {
    if (scaling_ && c_.scale_exp == TrainerCounters::kNoScale)
      c_.scale_exp = s_.precision.scale_exp;
    inf_pending_ = false;
    if (s_.ema.enabled && (fresh_run || ema_.empty())) ema_ = e_.state().params;
  }

  // The loss weight times the scale 2^e (exact: the weight stays a
  // rational, num * 2^e or den * 2^-e).
  LossWeight scaled(LossWeight w) const {
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

  bool grads_finite() {
    if constexpr (requires { e_.grads_finite(); }) {
      return e_.grads_finite();
    } else {
      return std::isfinite(static_cast<double>(e_.grad_norm()));
    }
  }

  // scaler.unscale_() on every rank: grads *= 2^-e (exact), found_inf
  // when any rank holds an inf or NaN (or an injected overflow).
  bool unscale_all(int64_t micro) {
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
  void scaler_update(int64_t micro, bool found_inf) {
    const PrecisionSpec& p = s_.precision;
    if (found_inf) {
      c_.scale_exp += p.backoff_exp;
      c_.growth_tracker = 0;
    } else if (++c_.growth_tracker == p.growth_interval) {
      c_.scale_exp += p.growth_exp;
      c_.growth_tracker = 0;
    }
    event(EventKind::scaler_update, micro, [&](Event& ev) {
      ev.loss_scale = std::ldexp(1.0, int(c_.scale_exp));
    });
  }

  // ema = ema * decay + p * (1 - decay), rank 0's parameters (the ranks
  // agree whenever they are in sync).  The factors are rounded once to
  // the engine's Real, as PyTorch's mul_(decay).add_(p, alpha=1-decay).
  void ema_update(int64_t micro) {
    use_rank(0);
    const std::vector<Real> p = e_.state().params;
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
  void advance_optimizer_state() {
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
  bool step_block(int64_t micro, bool clip_here) {
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
  bool clips_at_step() const {
    return s_.clip.enabled && !b_.clip_per_micro_step &&
           !(b_.clip_before_all_reduce && R_ > 1);
  }

  // clip_grad_norm_: coef = c / (norm + 1e-6), clamped to 1, in the
  // engine's arithmetic (float32 tensors in PyTorch).
  // An engine that keeps the factor symbolic (the contract tier's
  // coefficient engine) clips itself.
  void clip(int64_t micro) {
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
  void clip_sharded(int64_t micro) {
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
  void optimizer_step(int64_t micro) {
    const double lr = current_lr();
    StepRecord<Real> rec;
    rec.step = c_.optimizer_steps;
    rec.epoch = epoch_;
    rec.window = c_.windows;
    rec.lr = lr;
    use_rank(0);
    rec.grad_norm = static_cast<double>(e_.grad_norm());
    if (opt_.record_values) rec.grad = e_.state().grads;
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
          rec.param = e_.state().params;
        else
          rec.rank_param.insert(rec.rank_param.begin(), e_.state().params);
      }
    }
    run_.steps.push_back(std::move(rec));
    if (after_step_)
      each_rank([&](int64_t) { after_step_(run_.steps.back().step, e_); });
  }

  // Every rank's scheduler.step() (ranks in lockstep share one counter);
  // ddp-scheduler-per-rank: R calls per rank.
  void scheduler_step(int64_t micro) {
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
      const int64_t b = backward_;  // rank 0's backward pass of this micro-step
      each_rank([&](int64_t r) {
        if constexpr (requires { e_.set_epoch(epoch); }) e_.set_epoch(epoch);
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
    if (opt_.record_values) rec.param = e_.state().params;
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
