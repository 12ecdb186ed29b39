#include "sim/pitfalls.hpp"

#include <algorithm>

namespace accumcheck {

namespace {
struct Entry {
  Pitfall pitfall;
  std::string_view id;
  std::string_view story;
  // pitfall_performance_only (sim/pitfalls.hpp): same values, more work.
  bool performance_only = false;
};
constexpr Entry kCatalog[] = {
    {Pitfall::no_loss_normalization, "no-loss-normalization",
     "forgets the /K: each micro-batch mean is back-propagated whole, G = K*g"},
    {Pitfall::sample_mean_of_means, "sample-mean-of-means",
     "micro-batch mean / K with unequal micro-batches: samples weigh "
     "1/(K*b_k), not 1/N"},
    {Pitfall::zero_grad_every_micro_step, "zero-grad-every-micro-step",
     "zero_grad at the top of the micro-batch loop: only the last micro-batch "
     "counts"},
    {Pitfall::seed_002_loop, "seed-002-loop",
     "seed 002's loop verbatim: zero_grad inside the loop, the step `if` after "
     "it"},
    {Pitfall::zero_grad_never, "zero-grad-never",
     "never zeroes: every step applies the sum of all gradients so far"},
    {Pitfall::step_every_micro_step, "step-every-micro-step",
     "optimizer.step outside the `if`: K updates per window on growing partial "
     "sums"},
    {Pitfall::partial_cycle_scale_by_k, "partial-cycle-scale-by-k",
     "the partial last window of r < K micro-batches is still divided by K"},
    {Pitfall::partial_cycle_drop, "partial-cycle-drop",
     "the partial last window is never stepped; its samples go unseen"},
    {Pitfall::partial_cycle_leak, "partial-cycle-leak",
     "no step and no zeroing at epoch end: leftovers leak into the next epoch"},
    {Pitfall::scheduler_per_micro_step, "scheduler-per-micro-step",
     "scheduler.step() after every micro-step: step t uses S(t*K + K - 1)"},
    {Pitfall::schedule_horizon_in_micro_steps,
     "schedule-horizon-in-micro-steps",
     "warmup and horizon counted in micro-batches: the schedule runs K times "
     "too slowly"},
    {Pitfall::clip_per_micro_step, "clip-per-micro-step",
     "clip_grad_norm_ after every backward, on the running sum"},
    {Pitfall::l2_in_loss_unnormalized, "l2-in-loss-unnormalized",
     "lambda*|theta|^2/2 added to every micro-loss without /K: decay K times "
     "too strong"},
    {Pitfall::token_mean_of_means, "token-mean-of-means",
     "micro-batch token mean / K: a token weighs 1/(K*T_k), not 1/T (the 2024 "
     "Transformers bug)"},
    {Pitfall::ramp_normalization_stale, "ramp-normalization-stale",
     "K changes during training but the loss is still divided by the first "
     "epoch's K: where K_e != K_0 micro-batches weigh 1/(K_0*b_k)"},
    {Pitfall::ramp_schedule_horizon_fixed, "ramp-schedule-horizon-fixed",
     "the schedule's horizon computed once with the initial K: warmup and "
     "decay end early or late when K changes"},
    {Pitfall::window_boundary_off_by_one, "window-boundary-off-by-one",
     "`if step % K == 0` on a 0-based counter (seeds 002, 004): the first "
     "window has one micro-batch, every later window is shifted by one"},
    {Pitfall::scheduler_before_optimizer, "scheduler-before-optimizer",
     "scheduler.step() before optimizer.step(): step t uses the lr of step "
     "t+1"},
    {Pitfall::scheduler_per_epoch, "scheduler-per-epoch",
     "scheduler.step() once per epoch: the lr is constant within each epoch "
     "and the schedule advances by epochs, not steps"},
    {Pitfall::skip_short_micro_batch, "skip-short-micro-batch",
     "DataLoader(drop_last=True): the short last micro-batch of every epoch "
     "is never seen"},
    {Pitfall::token_count_unshifted_labels, "token-count-unshifted-labels",
     "the window's token count is taken over the unshifted labels: each "
     "sequence's position 0, which the shifted causal-LM loss never sums, "
     "counts as a token (Transformers 4.47-4.53)"},
    {Pitfall::ddp_token_mean_across_ranks, "ddp-token-mean-across-ranks",
     "each rank divides by its own window's token count, then DDP averages: "
     "a token weighs 1/(R*T_r), not 1/T"},
    {Pitfall::ddp_uneven_shards, "ddp-uneven-shards",
     "each rank averages over its own shard, then DDP averages ranks: with "
     "unequal shards a sample weighs 1/(R*N_r), not 1/N"},
    {Pitfall::ddp_no_sync_everywhere, "ddp-no-sync-everywhere",
     "no_sync on the window's last micro-step too: ranks step on local "
     "gradients and their parameters diverge"},
    {Pitfall::ddp_sync_every_micro_step, "ddp-sync-every-micro-step",
     "no no_sync at all: the same values with K times the all-reduces",
     /*performance_only=*/true},
    {Pitfall::ddp_clip_local_norm, "ddp-clip-local-norm",
     "clip_grad_norm_ on each rank's shard of the gradient: each shard "
     "clipped by its own norm (about 1/sqrt(R) of the total)"},
    {Pitfall::ddp_scheduler_per_rank, "ddp-scheduler-per-rank",
     "the scheduler stepped once per process per optimizer step: step t "
     "uses S(t*R)"},
    {Pitfall::low_precision_grad_buffer, "low-precision-grad-buffer",
     "gradients accumulated in a bf16 .grad: once the sum is 2^8 times a "
     "contribution, the contribution is lost (in bf16, 256 + 1 = 256)"},
    {Pitfall::clip_before_unscale, "clip-before-unscale",
     "clip_grad_norm_ before scaler.unscale_(): the scaled gradient is "
     "clipped, so the threshold acts as c/S"},
    {Pitfall::scaler_update_every_micro_step, "scaler-update-every-micro-step",
     "scaler.unscale_() and scaler.update() on every micro-step: the running "
     "sum is divided by S again at each micro-step, the scale moves K times "
     "per step"},
    {Pitfall::skipped_step_advances_scheduler,
     "skipped-step-advances-scheduler",
     "scheduler.step() after a step the scaler skipped for inf/NaN: the "
     "schedule runs ahead of the optimizer"},
    {Pitfall::accumulator_rescaled, "accumulator-rescaled",
     "buf = 2*buf + g at every micro-step: micro-batch k weighs 2^(K-1-k); "
     "scale-free optimizers hide it until 2^K overflows"},
    {Pitfall::ema_every_micro_step, "ema-every-micro-step",
     "the EMA of the weights updated every micro-step: it decays K times per "
     "optimizer step"},
    {Pitfall::optimizer_state_every_micro_step,
     "optimizer-state-every-micro-step",
     "Adam's step count and AdamW's decoupled weight decay advanced every "
     "micro-step: bias corrections use t*K, decay applied K times"},
    {Pitfall::window_boundary_off_by_one_max_steps,
     "window-boundary-off-by-one-max-steps",
     "`if step % K == 0 or step == len(loader) - 1` on a 0-based counter, "
     "with a break at max_train_steps (run_clm_no_trainer, 2021): a "
     "one-micro-batch first window, the epoch's rest stepped at its end, "
     "so an extra step per epoch and the run stops at max_train_steps with "
     "its last epochs' data unseen"},
    {Pitfall::step_budget_drops_micro_batches,
     "step-budget-drops-micro-batches",
     "training stops after epochs x floor(M/K) optimizer steps, a budget "
     "counted before training (M micro-batches per epoch): with M not a "
     "multiple of K the last epoch's remaining micro-batches never enter a "
     "step, and a linear or cosine schedule built with that budget as its "
     "horizon decays too early (Transformers' Trainer 4.45-4.51)"},
    {Pitfall::window_counter_across_epochs, "window-counter-across-epochs",
     "`if total % K == 0` on a micro-batch counter that runs across epochs: "
     "an epoch's leftover micro-batches join the next epoch's first window, "
     "whose windows are shifted (Transformers' Trainer 4.45, "
     "total_batched_samples)"},
    // Mistakes only a framework's loop makes (issue 33).
    {Pitfall::loss_divided_by_k_twice, "loss-divided-by-k-twice",
     "the loss divided by K by the user and again by the framework "
     "(DeepSpeed's engine.backward, Accelerate's backward, Lightning): "
     "every micro-batch weighs 1/K of what it should, G = g/K"},
    {Pitfall::end_of_loader_syncs_every_micro_batch,
     "end-of-loader-syncs-every-micro-batch",
     "Accelerate's accumulate() in a loop that draws its window first: the "
     "loader is at its end when the last window runs, so each of its "
     "micro-batches is synced and stepped alone"},
    // Transformers' Trainer 4.46-4.51's fetches (issue 33).
    {Pitfall::items_counted_per_fetch_group, "items-counted-per-fetch-group",
     "the items counted per fetch of K micro-batches from the epoch's "
     "start, the step decided on a counter across epochs: a step across "
     "the epoch boundary weighs each micro-batch on a fetch it only partly "
     "holds (Transformers' Trainer 4.46, get_batch_samples)"},
    {Pitfall::last_fetch_sized_in_samples, "last-fetch-sized-in-samples",
     "the epoch's last fetch sized N mod K in samples where M mod K "
     "micro-batches are left: the rest is never drawn and the drawn part, "
     "the epoch's end never reached, is neither stepped nor zeroed "
     "(Transformers' Trainer 4.46-4.51, #37777)"},
    // A hand-written all-reduce (issue 44).
    {Pitfall::ddp_clip_before_all_reduce, "ddp-clip-before-all-reduce",
     "clip_grad_norm_ on each rank's local gradient before a hand-written "
     "all_reduce(SUM) / R (the window under no_sync): each rank's share "
     "clipped by its own norm, G = (1/R) sum_r s_r g_r, not the averaged "
     "gradient's one clip"},
    // The linear scaling rule under accumulation (issue 44).
    {Pitfall::lr_scaled_by_k, "lr-scaled-by-k",
     "the optimizer built with lr * K (the linear scaling rule): correct "
     "accumulation already is the large batch, so every step runs at K "
     "times the intended lr"},
    // A scheduler's frequency under accumulation (issue 44).
    {Pitfall::scheduler_frequency_in_micro_batches,
     "scheduler-frequency-in-micro-batches",
     "a scheduler meant to step every f optimizer steps steps after the "
     "steps whose window ends on a micro-batch numbered a multiple of f in "
     "its epoch (Lightning's (batch_idx + 1) % frequency, #17544): with f "
     "dividing K, after every step"},
    // A hand-written window buffer (issue 44).
    {Pitfall::window_buffer_across_epochs, "window-buffer-across-epochs",
     "the window kept in a buffer that is not reset at the epoch's end: an "
     "epoch's leftover micro-batches wait for the next epoch's first ones "
     "to fill K, and that window is divided by the items of the whole "
     "joined window (hand-written buffers); the run's last leftover is "
     "never stepped"},
    // A recipe loop's running sum and count (issue 44).
    {Pitfall::window_sum_across_epochs, "window-sum-across-epochs",
     "`if (idx + 1) % K == 0` on the epoch's own index, but the gradients "
     "and the window's item count are not reset at the epoch's end: an "
     "epoch's leftover micro-batches join the next epoch's first K, a "
     "window of K + r divided by the items of all of them (torchtune's "
     "recipes); the run's last leftover is never stepped"},
    // reduction="sum" with the mean's / K.
    {Pitfall::summed_loss_divided_by_k, "summed-loss-divided-by-k",
     "each micro-batch's loss is the sum of its item losses "
     "(reduction=\"sum\") and the gradient is divided by K: every item "
     "weighs 1/K, not 1/N_w (b_k times too much)"},
};

const Entry& entry(Pitfall p) {
  for (const Entry& e : kCatalog)
    if (e.pitfall == p) return e;
  return kCatalog[0];  // unreachable: kCatalog lists every enumerator
}
}  // namespace

std::string_view pitfall_id(Pitfall p) { return entry(p).id; }
std::string_view pitfall_story(Pitfall p) { return entry(p).story; }
bool pitfall_performance_only(Pitfall p) { return entry(p).performance_only; }

std::optional<Pitfall> pitfall_from_id(std::string_view id) {
  for (const Entry& e : kCatalog)
    if (e.id == id) return e.pitfall;
  return std::nullopt;
}

Behavior behavior_of(const std::vector<Pitfall>& pitfalls) {
  Behavior b;
  for (Pitfall p : pitfalls) {
    switch (p) {
      case Pitfall::no_loss_normalization:
        b.normalization = Normalization::micro_mean;
        break;
      case Pitfall::sample_mean_of_means:
      case Pitfall::token_mean_of_means:
        // The same loop; items are tokens for token losses.
        b.normalization = Normalization::micro_mean_over_window_micros;
        break;
      case Pitfall::zero_grad_every_micro_step:
        b.zero_grad = ZeroGradTiming::every_micro_step;
        break;
      case Pitfall::seed_002_loop:
        // The seed's loop divides each micro-batch mean by K literally.
        b.seed_002_loop = true;
        b.normalization = Normalization::micro_mean_over_k;
        break;
      case Pitfall::zero_grad_never:
        b.zero_grad = ZeroGradTiming::never;
        break;
      case Pitfall::step_every_micro_step:
        b.step_every_micro_step = true;
        break;
      case Pitfall::partial_cycle_scale_by_k:
        // Only the partial window: on full windows `loss / K` with equal
        // micro-batches is correct, and with unequal ones it is the
        // mean-of-means pitfall, a switch of its own.
        b.partial_scale_by_k = true;
        break;
      case Pitfall::partial_cycle_drop:
        b.partial = PartialWindow::drop;
        break;
      case Pitfall::partial_cycle_leak:
        // The `if (i + 1) % K == 0` loop with `loss / K`: the leftover
        // micro-batches are weighted 1/(K*b_k); full windows stay correct
        // (their mean-of-means effect is a switch of its own).
        b.partial = PartialWindow::leak;
        b.partial_scale_by_k = true;
        break;
      case Pitfall::scheduler_per_micro_step:
        b.scheduler_per_micro_step = true;
        break;
      case Pitfall::schedule_horizon_in_micro_steps:
        b.schedule_horizon_in_micro_steps = true;
        break;
      case Pitfall::clip_per_micro_step:
        b.clip_per_micro_step = true;
        break;
      case Pitfall::l2_in_loss_unnormalized:
        b.l2_unnormalized = true;
        break;
      case Pitfall::ramp_normalization_stale:
        b.normalization_stale_k = true;
        break;
      case Pitfall::ramp_schedule_horizon_fixed:
        b.horizon_initial_k = true;
        break;
      case Pitfall::window_boundary_off_by_one:
        // As the seeds write it: `loss / K` (K literal), and the leftover
        // micro-batches of an epoch neither stepped nor zeroed.
        b.window_off_by_one = true;
        b.normalization = Normalization::micro_mean_over_k;
        b.partial = PartialWindow::leak;
        break;
      case Pitfall::scheduler_before_optimizer:
        b.scheduler_before_optimizer = true;
        break;
      case Pitfall::scheduler_per_epoch:
        b.scheduler_per_epoch = true;
        break;
      case Pitfall::skip_short_micro_batch:
        b.skip_short_micro_batch = true;
        break;
      case Pitfall::token_count_unshifted_labels:
        b.count_unshifted_labels = true;
        break;
      case Pitfall::ddp_token_mean_across_ranks:
      case Pitfall::ddp_uneven_shards:
        // The same loop; items are tokens for token losses.
        b.normalization = Normalization::rank_window_items;
        break;
      case Pitfall::ddp_no_sync_everywhere:
        b.sync = Sync::never;
        break;
      case Pitfall::ddp_sync_every_micro_step:
        b.sync = Sync::every_micro_step;
        break;
      case Pitfall::ddp_clip_local_norm:
        b.clip_local_norm = true;
        break;
      case Pitfall::ddp_scheduler_per_rank:
        b.scheduler_per_rank = true;
        break;
      case Pitfall::low_precision_grad_buffer:
        b.low_precision_grad_buffer = true;
        break;
      case Pitfall::clip_before_unscale:
        b.clip_before_unscale = true;
        break;
      case Pitfall::scaler_update_every_micro_step:
        b.scaler_update_every_micro_step = true;
        break;
      case Pitfall::skipped_step_advances_scheduler:
        b.skipped_step_advances_scheduler = true;
        break;
      case Pitfall::accumulator_rescaled:
        b.accumulator_rescaled = true;
        break;
      case Pitfall::ema_every_micro_step:
        b.ema_every_micro_step = true;
        break;
      case Pitfall::optimizer_state_every_micro_step:
        b.optimizer_state_every_micro_step = true;
        break;
      case Pitfall::window_boundary_off_by_one_max_steps:
        // The 2021 loop divides each micro-batch's mean by K literally,
        // steps the epoch's rest at its last batch, and breaks at
        // max_train_steps.
        b.window_off_by_one = true;
        b.normalization = Normalization::micro_mean_over_k;
        b.partial = PartialWindow::step;
        b.stop_at_planned_steps = true;
        break;
      case Pitfall::step_budget_drops_micro_batches:
        b.stop_at_floor_budget = true;
        break;
      case Pitfall::window_counter_across_epochs:
        // The leftover is neither stepped nor zeroed (the counter has not
        // reached a multiple of K); the window it joins is cut in drawn().
        b.windows_across_epochs = true;
        b.partial = PartialWindow::leak;
        break;
      case Pitfall::loss_divided_by_k_twice:
        b.loss_divided_by_k_again = true;
        break;
      case Pitfall::end_of_loader_syncs_every_micro_batch:
        b.end_of_loader_steps_every_micro_step = true;
        break;
      case Pitfall::items_counted_per_fetch_group:
        b.items_per_fetch_group = true;
        break;
      case Pitfall::last_fetch_sized_in_samples:
        b.last_fetch_in_samples = true;
        break;
      case Pitfall::ddp_clip_before_all_reduce:
        b.clip_before_all_reduce = true;
        break;
      case Pitfall::lr_scaled_by_k:
        b.lr_times_k = true;
        break;
      case Pitfall::scheduler_frequency_in_micro_batches:
        b.frequency_in_micro_batches = true;
        break;
      case Pitfall::window_buffer_across_epochs:
        // The joined window is cut in Trainer::run (buffered_epoch).
        b.buffer_across_epochs = true;
        break;
      case Pitfall::window_sum_across_epochs:
        // The joined window is cut in Trainer::run (joined_epoch).
        b.sum_across_epochs = true;
        break;
      case Pitfall::summed_loss_divided_by_k:
        b.normalization = Normalization::micro_sum_over_k;
        break;
    }
  }
  return b;
}

std::string semantics_name(const std::vector<Pitfall>& pitfalls) {
  if (pitfalls.empty()) return "correct";
  std::string s;
  for (Pitfall p : pitfalls) {
    if (!s.empty()) s += "+";
    s += pitfall_id(p);
  }
  return s;
}

namespace {
// no-loss-normalization's missing / K and loss-divided-by-k-twice's extra
// / K cancel: the pair is each micro-batch's mean divided by K once, which
// the catalog names by what it does (sample-/token-mean-of-means on
// unequal micro-batches, partial-cycle-scale-by-k on a short window).  As
// a candidate it would only alias those names, ahead of them in the
// catalog's order.
bool cancels(Pitfall a, Pitfall b) {
  auto is = [&](Pitfall x, Pitfall y) { return a == x && b == y; };
  return is(Pitfall::no_loss_normalization, Pitfall::loss_divided_by_k_twice) ||
         is(Pitfall::loss_divided_by_k_twice, Pitfall::no_loss_normalization);
}

// Whether p is a candidate of its own in this scope.
bool in_scope(const CandidateScope& scope, Pitfall p) {
  switch (p) {
    case Pitfall::sample_mean_of_means:
    case Pitfall::ddp_uneven_shards:
      return !scope.token_loss;
    case Pitfall::token_mean_of_means:
    case Pitfall::ddp_token_mean_across_ranks:
    case Pitfall::token_count_unshifted_labels:
      return scope.token_loss;
    case Pitfall::clip_before_unscale:
    case Pitfall::scaler_update_every_micro_step:
    case Pitfall::skipped_step_advances_scheduler:
      return scope.loss_scaling;
    case Pitfall::ema_every_micro_step:
      return scope.ema;
    case Pitfall::low_precision_grad_buffer:
      return !scope.contract_tier || scope.contract_lowp_buffer;
    case Pitfall::optimizer_state_every_micro_step:
      return !scope.contract_tier;
    // A clip by chunks scales each chunk of the gradient by its own
    // factor: no combination of whole micro-batch gradients, except
    // within one rank's shard, which a sharded trace fits on its own.
    case Pitfall::ddp_clip_local_norm:
      return !scope.contract_tier || scope.contract_shard_clip;
    // Added beside window-counter-across-epochs below, never alone.
    case Pitfall::items_counted_per_fetch_group:
      return false;
    case Pitfall::ddp_clip_before_all_reduce:
      return scope.ranks_clip;
    case Pitfall::scheduler_frequency_in_micro_batches:
      return scope.schedule_frequency;
    default:
      return true;
  }
}

// window-counter-across-epochs cuts the windows itself: no pair with
// the other loops that cut them (window-boundary-off-by-one*).
// window-buffer-across-epochs cuts them too (no pair with those three),
// and never leaves a partial window to run: the partial-cycle pitfalls
// change nothing beside it.  window-sum-across-epochs cuts them and
// decides the partial window too: the same five, and the buffer.
bool cuts_both(Pitfall a, Pitfall b) {
  auto off_by_one = [](Pitfall p) {
    return p == Pitfall::window_boundary_off_by_one ||
           p == Pitfall::window_boundary_off_by_one_max_steps;
  };
  const Pitfall across = Pitfall::window_counter_across_epochs;
  auto beside_buffer = [&](Pitfall p) {
    return p == across || off_by_one(p) ||
           p == Pitfall::partial_cycle_scale_by_k ||
           p == Pitfall::partial_cycle_drop || p == Pitfall::partial_cycle_leak;
  };
  const Pitfall buffer = Pitfall::window_buffer_across_epochs;
  const Pitfall sum = Pitfall::window_sum_across_epochs;
  auto beside_sum = [&](Pitfall p) { return p == buffer || beside_buffer(p); };
  return (a == across && off_by_one(b)) || (b == across && off_by_one(a)) ||
         (a == buffer && beside_buffer(b)) ||
         (b == buffer && beside_buffer(a)) || (a == sum && beside_sum(b)) ||
         (b == sum && beside_sum(a));
}
}  // namespace

std::vector<Pitfall> candidate_catalog(const CandidateScope& scope) {
  std::vector<Pitfall> catalog;
  // The mean-of-means pitfalls, and the two DDP ones that are one switch
  // (rank_window_items), are named for the loss: the other is left out.
  for (Pitfall p : kAllPitfalls)
    if (in_scope(scope, p)) catalog.push_back(p);
  return catalog;
}

std::vector<std::vector<Pitfall>> candidate_semantics(CandidateScope scope) {
  const std::vector<Pitfall> catalog = candidate_catalog(scope);
  std::vector<std::vector<Pitfall>> sems = {{}};
  for (Pitfall p : catalog) sems.push_back({p});
  for (size_t i = 0; i < catalog.size(); ++i)
    for (size_t j = i + 1; j < catalog.size(); ++j)
      if (!cuts_both(catalog[i], catalog[j]) &&
          !cancels(catalog[i], catalog[j]))
        sems.push_back({catalog[i], catalog[j]});
  if (scope.stopped_short) {
    const Pitfall budget = Pitfall::step_budget_drops_micro_batches;
    for (size_t i = 0; i < catalog.size(); ++i)
      for (size_t j = i + 1; j < catalog.size(); ++j)
        if (catalog[i] != budget && catalog[j] != budget &&
            !cuts_both(catalog[i], catalog[j]) &&
            !cancels(catalog[i], catalog[j]))
          sems.push_back({catalog[i], catalog[j], budget});
  }
  // items-counted-per-fetch-group beside every candidate whose windows
  // are cut across epochs and whose normalization counts items (the
  // only candidates it changes), right after window-counter-across-epochs.
  const size_t before = sems.size();
  for (size_t k = 0; k < before; ++k) {
    const Behavior b = behavior_of(sems[k]);
    if (!b.windows_across_epochs ||
        (b.normalization != Normalization::window_items &&
         b.normalization != Normalization::rank_window_items))
      continue;
    std::vector<Pitfall> with = sems[k];
    const auto across = std::find(with.begin(), with.end(),
                                  Pitfall::window_counter_across_epochs);
    with.insert(across + 1, Pitfall::items_counted_per_fetch_group);
    sems.push_back(std::move(with));
  }
  return sems;
}

namespace {
// The order candidates are named in: the catalog's, with
// items-counted-per-fetch-group right after window-counter-across-epochs
// and step-budget-drops-micro-batches last (as candidate_semantics
// writes them).
int name_rank(Pitfall p) {
  const int n = int(std::size(kAllPitfalls));
  if (p == Pitfall::step_budget_drops_micro_batches) return 2 * n + 1;
  if (p == Pitfall::items_counted_per_fetch_group)
    p = Pitfall::window_counter_across_epochs;
  const int i =
      int(std::find(std::begin(kAllPitfalls), std::end(kAllPitfalls), p) -
          std::begin(kAllPitfalls));
  return 2 * i;
}

std::vector<Pitfall> named_order(std::vector<Pitfall> sem) {
  std::stable_sort(sem.begin(), sem.end(), [](Pitfall a, Pitfall b) {
    const int ra = name_rank(a), rb = name_rank(b);
    if (ra != rb) return ra < rb;
    return a == Pitfall::window_counter_across_epochs &&
           b == Pitfall::items_counted_per_fetch_group;
  });
  return sem;
}

// Whether a combination is one the catalog composes, each of its pitfalls
// changing the loop: no two that cut the windows both, none that cancel,
// none whose switch another overrides (its removal changes nothing), and
// items-counted-per-fetch-group only beside window-counter-across-epochs
// on a loop that counts items.
bool composes(const std::vector<Pitfall>& sem) {
  for (size_t i = 0; i < sem.size(); ++i)
    for (size_t j = i + 1; j < sem.size(); ++j)
      if (sem[i] == sem[j] || cuts_both(sem[i], sem[j]) ||
          cancels(sem[i], sem[j]))
        return false;
  const Behavior all = behavior_of(sem);
  if (std::find(sem.begin(), sem.end(),
                Pitfall::items_counted_per_fetch_group) != sem.end() &&
      (!all.windows_across_epochs ||
       (all.normalization != Normalization::window_items &&
        all.normalization != Normalization::rank_window_items)))
    return false;
  for (size_t i = 0; i < sem.size(); ++i) {
    std::vector<Pitfall> without = sem;
    without.erase(without.begin() + std::ptrdiff_t(i));
    if (behavior_of(without) == all) return false;
  }
  return true;
}
}  // namespace

void search_combinations(
    const CandidateScope& scope,
    const std::vector<std::pair<std::vector<Pitfall>, Residual>>& ranked,
    const std::function<
        std::vector<Residual>(const std::vector<std::vector<Pitfall>>&)>& judge,
    size_t max_pitfalls, size_t beam) {
  std::vector<Pitfall> catalog = candidate_catalog(scope);
  catalog.push_back(Pitfall::items_counted_per_fetch_group);
  std::vector<Behavior> seen;
  for (const auto& [sem, res] : ranked) seen.push_back(behavior_of(sem));
  // The beam: the closest candidates that still leave something out.
  std::vector<std::pair<std::vector<Pitfall>, Residual>> front;
  for (const auto& x : ranked)
    if (x.second.out > 0) front.push_back(x);
  auto closest = [&](auto& v) {
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return a.second < b.second;
    });
    if (v.size() > beam) v.resize(beam);
  };
  closest(front);
  while (!front.empty()) {
    // This size's extensions, each with the residual of the one it extends.
    std::vector<std::vector<Pitfall>> ext;
    std::vector<Residual> parent;
    for (const auto& [sem, res] : front) {
      if (sem.size() >= max_pitfalls) continue;
      for (Pitfall p : catalog) {
        if (std::find(sem.begin(), sem.end(), p) != sem.end()) continue;
        std::vector<Pitfall> with = sem;
        with.push_back(p);
        with = named_order(std::move(with));
        if (!composes(with)) continue;
        const Behavior b = behavior_of(with);
        if (std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
        seen.push_back(b);
        ext.push_back(std::move(with));
        parent.push_back(res);
      }
    }
    if (ext.empty()) return;
    const std::vector<Residual> got = judge(ext);
    std::vector<std::pair<std::vector<Pitfall>, Residual>> next;
    for (size_t i = 0; i < ext.size(); ++i) {
      // One explains the trace: the search ends.
      if (got[i].out == 0) return;
      // Kept only when it explains more of the residual than the
      // candidate it extends.
      if (got[i] < parent[i]) next.emplace_back(std::move(ext[i]), got[i]);
    }
    closest(next);
    front = std::move(next);
  }
}

}  // namespace accumcheck
