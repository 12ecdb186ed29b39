// The pitfall catalog (DESIGN.md section 5) and the trainer behaviour each
// one switches.  Ids are spelled exactly as DESIGN.md writes them, in code,
// scenario files, traces and output.
//
// A pitfall is a switch on the one trainer loop (sim/trainer.hpp), never a
// copy of it: `Behavior` is the full set of switches, `correct` is the
// default-constructed value, and each pitfall edits one or two fields, so
// pairs of pitfalls compose (certification ranks pairs).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accumcheck {

enum class Pitfall {
  no_loss_normalization,
  sample_mean_of_means,
  zero_grad_every_micro_step,
  seed_002_loop,
  zero_grad_never,
  step_every_micro_step,
  partial_cycle_scale_by_k,
  partial_cycle_drop,
  partial_cycle_leak,
  scheduler_per_micro_step,
  schedule_horizon_in_micro_steps,
  clip_per_micro_step,
  l2_in_loss_unnormalized,
  token_mean_of_means,
  ramp_normalization_stale,
  ramp_schedule_horizon_fixed,
  window_boundary_off_by_one,
  scheduler_before_optimizer,
  scheduler_per_epoch,
  skip_short_micro_batch,
  token_count_unshifted_labels,
  // Data parallelism (R ranks, DDP).
  ddp_token_mean_across_ranks,
  ddp_uneven_shards,
  ddp_no_sync_everywhere,
  ddp_sync_every_micro_step,
  ddp_clip_local_norm,
  ddp_scheduler_per_rank,
  // Precision, loss scaling and the training state beyond gradients.
  low_precision_grad_buffer,
  clip_before_unscale,
  scaler_update_every_micro_step,
  skipped_step_advances_scheduler,
  accumulator_rescaled,
  ema_every_micro_step,
  optimizer_state_every_micro_step,
  window_boundary_off_by_one_max_steps,
  // Transformers' Trainer 4.45-4.51 (issue 33): its step budget and its
  // window counter that runs across epochs.
  window_counter_across_epochs,
  step_budget_drops_micro_batches,
  // Mistakes only a framework's loop makes (issue 33).
  loss_divided_by_k_twice,
  end_of_loader_syncs_every_micro_batch,
  // Transformers' Trainer 4.46-4.51 draws each window's batches first
  // (get_batch_samples, issue 33): the fetch's item count and the
  // epoch's last fetch.
  items_counted_per_fetch_group,
  last_fetch_sized_in_samples,
  // A hand-written all-reduce after a per-rank clip (issue 44).
  ddp_clip_before_all_reduce,
  // The linear scaling rule applied to accumulation (issue 44).
  lr_scaled_by_k,
  // A scheduler's frequency counted in micro-batches (Lightning, issue 44).
  scheduler_frequency_in_micro_batches,
  // A window buffer that outlives the epoch (issue 44).
  window_buffer_across_epochs,
  // A window's gradient sum and item count that outlive the epoch while
  // its counter restarts (torchtune's recipes, issue 44).
  window_sum_across_epochs,
  // Each micro-batch's loss summed over its items (reduction="sum") and
  // divided by K, the /K meant for a mean.
  summed_loss_divided_by_k,
};

inline constexpr Pitfall kAllPitfalls[] = {
    Pitfall::no_loss_normalization,
    Pitfall::sample_mean_of_means,
    Pitfall::zero_grad_every_micro_step,
    Pitfall::seed_002_loop,
    Pitfall::zero_grad_never,
    Pitfall::step_every_micro_step,
    Pitfall::partial_cycle_scale_by_k,
    Pitfall::partial_cycle_drop,
    Pitfall::partial_cycle_leak,
    Pitfall::scheduler_per_micro_step,
    Pitfall::schedule_horizon_in_micro_steps,
    Pitfall::clip_per_micro_step,
    Pitfall::l2_in_loss_unnormalized,
    Pitfall::token_mean_of_means,
    Pitfall::ramp_normalization_stale,
    Pitfall::ramp_schedule_horizon_fixed,
    Pitfall::window_boundary_off_by_one,
    Pitfall::scheduler_before_optimizer,
    Pitfall::scheduler_per_epoch,
    Pitfall::skip_short_micro_batch,
    Pitfall::token_count_unshifted_labels,
    Pitfall::ddp_token_mean_across_ranks,
    Pitfall::ddp_uneven_shards,
    Pitfall::ddp_no_sync_everywhere,
    Pitfall::ddp_sync_every_micro_step,
    Pitfall::ddp_clip_local_norm,
    Pitfall::ddp_scheduler_per_rank,
    Pitfall::low_precision_grad_buffer,
    Pitfall::clip_before_unscale,
    Pitfall::scaler_update_every_micro_step,
    Pitfall::skipped_step_advances_scheduler,
    Pitfall::accumulator_rescaled,
    Pitfall::ema_every_micro_step,
    Pitfall::optimizer_state_every_micro_step,
    Pitfall::window_boundary_off_by_one_max_steps,
    Pitfall::window_counter_across_epochs,
    Pitfall::step_budget_drops_micro_batches,
    Pitfall::loss_divided_by_k_twice,
    Pitfall::end_of_loader_syncs_every_micro_batch,
    Pitfall::items_counted_per_fetch_group,
    Pitfall::last_fetch_sized_in_samples,
    Pitfall::ddp_clip_before_all_reduce,
    Pitfall::lr_scaled_by_k,
    Pitfall::scheduler_frequency_in_micro_batches,
    Pitfall::window_buffer_across_epochs,
    Pitfall::window_sum_across_epochs,
    Pitfall::summed_loss_divided_by_k,
};

// "zero-grad-every-micro-step" etc.
std::string_view pitfall_id(Pitfall p);
std::optional<Pitfall> pitfall_from_id(std::string_view id);
// One sentence: what the trainer does wrong.
std::string_view pitfall_story(Pitfall p);
// A performance-only pitfall changes no value (the trainer's gradients and
// parameters are those of the semantics without it, within the bound) and
// only the work or communication it takes (ddp-sync-every-micro-step: K
// gradient all-reduces per step where one suffices).  certify PASSes a
// trace whose values are the accepted semantics' and whose only
// difference is such a pitfall's events, with a performance finding
// naming it; never by the pitfall's name, by this property.
bool pitfall_performance_only(Pitfall p);

// How each micro-batch's summed per-item loss is weighted before backward.
// Every weight is 1/integer, so the oracle applies it exactly.
enum class Normalization {
  window_items,  // 1/N_w: the window's item count, before 1st backward
  micro_mean,    // 1/b_k: the micro-batch mean, /K forgotten
  micro_mean_over_window_micros,  // 1/(K_w*b_k): mean of means
  micro_mean_over_k,              // 1/(K*b_k): the `loss / K` loop, K literal
  micro_sum_over_k,   // 1/K: the summed loss / K, K literal (b_k too much)
  rank_window_items,  // 1/N_{w,r}: the rank's own window items, then DDP's
                      // average over R (the count never all-reduced)
};

// When DDP all-reduces the ranks' gradients (R > 1; no effect at R = 1).
enum class Sync {
  window_end,        // no_sync on every micro-step but the window's last
  every_micro_step,  // no no_sync: an all-reduce after every backward
  never,             // no_sync everywhere: ranks step on local gradients
};

enum class ZeroGradTiming { after_step, every_micro_step, never };

// What happens to a partial last window (r < K micro-batches).
// (partial-cycle-scale-by-k is a normalization: the window is stepped
// with every micro-batch weighted 1/(K*b_k), K literal.)
enum class PartialWindow {
  step,  // stepped (normalized as `normalization` says)
  drop,  // not stepped, gradients zeroed at epoch end
  leak,  // not stepped, not zeroed: joins the next window
};

struct Behavior {
  Normalization normalization = Normalization::window_items;
  ZeroGradTiming zero_grad = ZeroGradTiming::after_step;
  PartialWindow partial = PartialWindow::step;
  bool step_every_micro_step = false;
  bool scheduler_per_micro_step = false;
  bool schedule_horizon_in_micro_steps = false;
  bool clip_per_micro_step = false;
  bool l2_unnormalized = false;
  bool seed_002_loop = false;
  // partial-cycle-scale-by-k: a partial window's micro-batches weigh
  // 1/(K*b_k), K literal; full windows keep `normalization`.
  bool partial_scale_by_k = false;
  // ramp-normalization-stale: the `loss / K` loop whose K is still the
  // first epoch's after K changes: in every epoch whose K is not K_0,
  // every micro-batch weighs 1/(K_0*b_k) (epochs at K_0: `normalization`).
  bool normalization_stale_k = false;
  // ramp-schedule-horizon-fixed: a total = "auto" horizon (and warmup
  // ratio) computed once with the initial K (sim/k_schedule.hpp).
  bool horizon_initial_k = false;
  // window-boundary-off-by-one: `if i % K == 0` on the 0-based micro-batch
  // counter of each epoch: windows [0], [1..K], [K+1..2K], ...; the
  // leftover micro-batches after the last multiple of K are a partial
  // window (treated as `partial` says: leak for this pitfall).
  bool window_off_by_one = false;
  // window-boundary-off-by-one-max-steps: `if completed_steps >=
  // max_train_steps: break` after every micro-step, max_train_steps =
  // epochs x ceil(micro-steps of epoch 0 / K) computed before training
  // (run_clm_no_trainer): once the steps reach it, every epoch ends after
  // the window that got there.
  bool stop_at_planned_steps = false;
  // scheduler-before-optimizer: the boundary calls scheduler.step() before
  // optimizer.step(): step t uses S(t+1).
  bool scheduler_before_optimizer = false;
  // scheduler-per-epoch: scheduler.step() once at each epoch's end, not
  // per window: every step of epoch e uses S(e).
  bool scheduler_per_epoch = false;
  // skip-short-micro-batch: DataLoader(drop_last=True): an epoch's short
  // last micro-batch (fewer than b samples) is never drawn.
  bool skip_short_micro_batch = false;
  // token-count-unshifted-labels: the window's token count N_w (and each
  // rank's) is taken over the unshifted labels, while the causal-LM loss
  // sums the shifted positions 1..n-1: every sequence adds its position 0,
  // so N_w is the loss-bearing tokens plus the window's sequences.
  bool count_unshifted_labels = false;
  Sync sync = Sync::window_end;
  // ddp-clip-local-norm: the gradient sharded over ranks in R contiguous
  // chunks (ZeRO/FSDP), each chunk clipped by its own norm.
  bool clip_local_norm = false;
  // ddp-clip-before-all-reduce: each rank clips its own whole local
  // gradient (by its own norm) at the window's end, before the all-reduce
  // averages them; no clip after it.
  bool clip_before_all_reduce = false;
  // ddp-scheduler-per-rank: R scheduler.step() calls per optimizer step.
  bool scheduler_per_rank = false;
  // low-precision-grad-buffer: the micro-batches accumulate in a bf16
  // .grad where the scenario's buffer is fp32 (no float32 accumulation
  // buffer beside bf16 weights).
  bool low_precision_grad_buffer = false;
  // clip-before-unscale: clip_grad_norm_ on the scaled gradient, before
  // scaler.unscale_(): the threshold acts as c / S.
  bool clip_before_unscale = false;
  // scaler-update-every-micro-step: scaler.unscale_() and scaler.update()
  // after every backward, not only at the step: the running sum is
  // unscaled again at each micro-step and the scale moves per micro-step.
  bool scaler_update_every_micro_step = false;
  // skipped-step-advances-scheduler: scheduler.step() even when the scaler
  // skipped optimizer.step() for an inf/NaN.
  bool skipped_step_advances_scheduler = false;
  // accumulator-rescaled: buf = 2*buf + g at every micro-step: micro-batch
  // k of K weighs 2^(K-1-k).
  bool accumulator_rescaled = false;
  // ema-every-micro-step: the EMA updated after every micro-step (K times
  // per optimizer step), not after each optimizer step.
  bool ema_every_micro_step = false;
  // optimizer-state-every-micro-step: Adam's step count t and AdamW's
  // decoupled decay p *= 1 - lr*wd advanced at every micro-step that does
  // not step (keras' per-call state), besides the step's own.
  bool optimizer_state_every_micro_step = false;
  // step-budget-drops-micro-batches: training stops once the optimizer
  // steps reach epochs x max(1, floor(M / K)) (M: epoch 0's micro-steps),
  // the budget Transformers' Trainer 4.45-4.51 computed before training:
  // with M not a multiple of K the last epoch's remaining micro-batches
  // never enter a step.  The same budget is the horizon of the scheduler
  // the trainer builds (num_training_steps = max_steps): a linear or cosine
  // schedule's total, and a warmup ratio's base (sim/lr_schedule.hpp
  // with_horizon).
  bool stop_at_floor_budget = false;
  // window-counter-across-epochs: the step decision `total % K == 0` on a
  // micro-batch counter that runs across epochs (Trainer 4.45's
  // total_batched_samples): an epoch's leftover micro-batches are neither
  // stepped nor zeroed and the next epoch's first window only completes
  // the K (its windows shifted); an epoch of M <= K micro-batches is
  // stepped at its end.
  bool windows_across_epochs = false;
  // loss-divided-by-k-twice: the framework divides every micro-batch's
  // loss by K (Accelerate's and DeepSpeed's backward, Lightning's
  // closure) after the user's loop already normalized it: every weight
  // the rest of the behaviour gives is divided by K once more (K literal,
  // the epoch's, partial windows included: composed with
  // partial-cycle-scale-by-k a short window's items weigh 1/(K^2*b_k)).
  bool loss_divided_by_k_again = false;
  // end-of-loader-syncs-every-micro-batch: in each epoch's last window
  // every micro-step ends with the boundary block (sync, step, scheduler,
  // zero_grad): Accelerate's accumulate() syncs whenever the prepared
  // loader is at its end, and a loop that draws its window before the
  // first backward has drawn the loader's last batch before the window's
  // first micro-step.  Each micro-batch keeps the weight the behaviour
  // gives it (the window's N_w, counted before the window).
  bool end_of_loader_steps_every_micro_step = false;
  // items-counted-per-fetch-group: the loop draws each epoch's
  // micro-batches K at a time from the epoch's start (a fetch) and
  // counts the fetch's items before its first backward: an item-counting
  // normalization (window_items, rank_window_items) divides each
  // micro-batch by its fetch's count (every rank's, or the rank's own)
  // instead of its window's.  The same as correct wherever the windows
  // are the fetches: it shows only where a step is decided elsewhere
  // (window-counter-across-epochs).
  bool items_per_fetch_group = false;
  // last-fetch-sized-in-samples: the epoch's last fetch draws r = N mod K
  // micro-batches (N: the epoch's samples over all ranks; r = K when 0)
  // where M mod K are left (M: its micro-batches): when r is fewer, the
  // epoch's last M mod K - r micro-batches are never drawn, and the
  // epoch's end (`step + 1 == M`) is never reached, so the drawn rest of
  // its last window is neither stepped nor zeroed (it joins the next
  // window).
  bool last_fetch_in_samples = false;
  // lr-scaled-by-k: the optimizer built with lr * K (the linear scaling
  // rule, as if accumulation made a larger batch that needs a larger lr):
  // every step's lr is K (the scenario's first K) times the schedule's.
  bool lr_times_k = false;
  // scheduler-frequency-in-micro-batches: a scheduler declared to step
  // every f optimizer steps (the schedule's frequency) steps after the
  // optimizer steps whose window ends on a micro-batch whose number in
  // the epoch (from 1) is a multiple of f (Lightning's `(batch_idx + 1)
  // % frequency`): with f dividing K, after every step.
  bool frequency_in_micro_batches = false;
  // window-buffer-across-epochs: the loop keeps its window in a buffer
  // (a list of micro-batches, or a running window and its count) that is
  // not reset at an epoch's end and steps when it holds K: the run's
  // micro-batches cut into K from the run's start, an epoch's leftover
  // carried unrun into the next epoch's first window, which completes the
  // K and is counted whole before its first backward (each micro-batch at
  // 1/N over the joined window's items); the run's last leftover is never
  // backwarded.  No partial window ever runs.
  bool buffer_across_epochs = false;
  // window-sum-across-epochs: the loop steps at `(idx + 1) % K == 0` on
  // the epoch's own micro-batch index but zeroes neither the gradients
  // nor its running item count at the epoch's end: an epoch's leftover
  // (backwarded, not stepped) joins the next epoch's first K
  // micro-batches, a window of K + r divided by the items of the whole
  // joined window (each micro-batch at 1/N over it); the run's last
  // leftover is backwarded and never stepped.
  bool sum_across_epochs = false;

  bool operator==(const Behavior&) const = default;
};

// The behaviour of a trainer with these pitfalls (empty: `correct`).
Behavior behavior_of(const std::vector<Pitfall>& pitfalls);

// The candidates certification and the contract property judge: correct,
// every single pitfall and every pair, with the mean-of-means pitfall of
// the model's loss only (sample- for sample losses, token- for token
// losses: the same switch, named for the loss); likewise
// ddp-uneven-shards (sample losses) or ddp-token-mean-across-ranks (token
// losses).  The GradScaler pitfalls
// (clip-before-unscale, scaler-update-every-micro-step,
// skipped-step-advances-scheduler) are candidates only with loss
// scaling, ema-every-micro-step only with an EMA (elsewhere they are
// `correct`); the contract tier (whose coefficient engine holds neither
// rounded buffers nor parameters) leaves out low-precision-grad-buffer
// (except on a bf16 .grad: contract_lowp_buffer),
// optimizer-state-every-micro-step and ddp-clip-local-norm (a clip by
// chunks is no combination of micro-batch gradients) -- except on a trace
// whose recorder fitted each rank's shard and recorded its clips' shard
// norms (contract_shard_clip).
struct CandidateScope {
  bool token_loss = false;
  bool loss_scaling = false;
  bool ema = false;
  bool contract_tier = false;
  // The contract tier on a trace whose .grad accumulates in bfloat16 (its
  // step fit within the bf16 bound only): low-precision-grad-buffer is a
  // candidate there (predicting correct's weights, judged with the bf16
  // step bound).
  bool contract_lowp_buffer = false;
  // The run stopped short (the contract tier: the trace takes fewer
  // optimizer steps than correct accumulation): every pair is also a
  // candidate with step-budget-drops-micro-batches as a third pitfall
  // (a budget cuts any loop short, whatever it does per window).
  bool stopped_short = false;
  // The contract tier on a sharded trace (FSDP: each rank's step fit on its
  // own shard, each clip's norm of the rank's shard recorded):
  // ddp-clip-local-norm is a candidate, its clip symbol the shard's factor.
  bool contract_shard_clip = false;
  // R > 1 ranks with a clip: ddp-clip-before-all-reduce is a candidate
  // (anywhere else it changes nothing).
  bool ranks_clip = false;
  // A schedule stepped every f > 1 optimizer steps (its frequency):
  // scheduler-frequency-in-micro-batches is a candidate (at f = 1 it
  // changes nothing).
  bool schedule_frequency = false;
};
// items-counted-per-fetch-group changes a loop only where its steps are
// not its fetches (in the catalog: window-counter-across-epochs) and its
// normalization counts items: it is no candidate of its own, but added to
// every candidate that cuts its windows across epochs and counts items,
// as one more pitfall (named after window-counter-across-epochs).
// Anywhere else it would only alias the candidate without it.
std::vector<std::vector<Pitfall>> candidate_semantics(CandidateScope scope);

// The pitfalls candidate_semantics composes in this scope, in the
// catalog's order (items-counted-per-fetch-group left out: never alone).
std::vector<Pitfall> candidate_catalog(const CandidateScope& scope);

// What a candidate leaves unexplained, for the combination search: how many
// of the trace's judged values (weights, steps) lie beyond their bound,
// then by how much in sum.  Less is closer; out == 0 explains the trace.
struct Residual {
  int64_t out = 0;
  double excess = 0;
  auto operator<=>(const Residual&) const = default;
};

// Combinations of more pitfalls than candidate_semantics' pairs (issue
// 44): a beam search, never every subset.  From the `beam` closest of the
// candidates already judged (`ranked`: each with its residual) that leave
// something out, each is extended by one pitfall of the scope's catalog at
// a time, where the pitfall composes with it (no two cutting the windows,
// none cancelling, none that another overrides: each must change the
// loop) and the combination's behaviour is not one judged already; an
// extension is kept only where it leaves less out than the candidate it
// extends, and the `beam` closest of those are extended again, up to
// `max_pitfalls` pitfalls (limits table: combination_pitfalls).  `judge`
// judges one size's extensions together (and records them as the tier
// ranks candidates), returning their residuals in order; the search ends
// at the size where one's residual is 0.
void search_combinations(
    const CandidateScope& scope,
    const std::vector<std::pair<std::vector<Pitfall>, Residual>>& ranked,
    const std::function<
        std::vector<Residual>(const std::vector<std::vector<Pitfall>>&)>& judge,
    size_t max_pitfalls, size_t beam);

// "correct", or the ids joined by "+".
std::string semantics_name(const std::vector<Pitfall>& pitfalls);

}  // namespace accumcheck
