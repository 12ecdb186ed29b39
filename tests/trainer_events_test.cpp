// The trainer's call order for every pitfall, pinned as DESIGN.md section 5
// writes it.  NullEngine does no math: what is checked is the sequence of
// zero_grad (Z), forward_backward (F), clip (C), optimizer_step (O) and
// scheduler_step (S) calls over one epoch of 5 micro-batches with K = 2:
// two full windows and a partial one of a single micro-batch.
#include <gtest/gtest.h>

#include <string>

#include "sim/plan.hpp"
#include "sim/trainer.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck {
namespace {

Scenario five_micro_batches(int64_t samples = 5) {
  Scenario s;
  s.data.samples = samples;
  s.data.shuffle = false;
  s.batching.micro_batch = 1;
  s.batching.accumulation = 2;
  s.batching.epochs = 1;
  s.clip.enabled = true;  // every pattern shows where clipping happens
  s.clip.max_norm = 1.0;
  return s;
}

std::string pattern_of(const Scenario& s,
                       const std::vector<Pitfall>& pitfalls) {
  NullEngine e;
  Trainer<NullEngine> t(e, s, behavior_of(pitfalls), 0.1);
  const Run<double> run = t.run(make_plan(s), "x");
  std::string p;
  for (const Event& ev : run.events) {
    switch (ev.kind) {
      case EventKind::zero_grad:
        p += 'Z';
        break;
      case EventKind::forward_backward:
        p += 'F';
        break;
      case EventKind::clip:
        p += 'C';
        break;
      case EventKind::optimizer_step:
        p += 'O';
        break;
      case EventKind::scheduler_step:
        p += 'S';
        break;
      case EventKind::all_reduce:
        p += 'A';
        break;
      case EventKind::unscale:
        p += 'U';
        break;
      case EventKind::scaler_update:
        p += 'G';
        break;
      case EventKind::ema_update:
        p += 'E';
        break;
    }
  }
  return p;
}

std::string pattern(const std::vector<Pitfall>& pitfalls, int64_t samples = 5,
                    int64_t micro_batch = 1) {
  Scenario s = five_micro_batches(samples);
  s.batching.micro_batch = micro_batch;
  return pattern_of(s, pitfalls);
}

// The same over R ranks (R times the samples: every rank sees `samples`).
std::string ranks_pattern(const std::vector<Pitfall>& pitfalls, int64_t samples,
                          int64_t ranks) {
  Scenario s = five_micro_batches(samples * ranks);
  s.batching.ranks = ranks;
  return pattern_of(s, pitfalls);
}

// Windows: [F F] [F F] [F] (partial).  One row per pitfall; a pitfall
// added to the catalog without a row fails EveryPitfallIsPinned.
struct Pinned {
  Pitfall pitfall;
  const char* pattern;
  const char* why;
};
constexpr const char* kCorrect =
    "FFCOSZ"
    "FFCOSZ"
    "FCOSZ";
const Pinned kPinned[] = {
    {Pitfall::no_loss_normalization, kCorrect, "weights only"},
    {Pitfall::sample_mean_of_means, kCorrect, "weights only"},
    {Pitfall::summed_loss_divided_by_k, kCorrect, "weights only"},
    {Pitfall::token_mean_of_means, kCorrect, "weights only"},
    {Pitfall::partial_cycle_scale_by_k, kCorrect, "weights only"},
    {Pitfall::schedule_horizon_in_micro_steps, kCorrect, "lr values only"},
    {Pitfall::l2_in_loss_unnormalized, kCorrect, "gradient values only"},
    {Pitfall::ramp_normalization_stale, kCorrect, "weights only"},
    {Pitfall::ramp_schedule_horizon_fixed, kCorrect, "lr values only"},
    {Pitfall::zero_grad_every_micro_step,
     "ZFZFCOS"
     "ZFZFCOS"
     "ZFCOS",
     "zero_grad at the top of the micro-batch loop, and only there"},
    {Pitfall::seed_002_loop, "ZFZFZFZFZF",
     "5 micro-batches, K = 2: the `if` after the loop is false, no step"},
    {Pitfall::zero_grad_never,
     "FFCOS"
     "FFCOS"
     "FCOS",
     "no zero_grad at all"},
    {Pitfall::step_every_micro_step,
     "FCOFCOSZ"
     "FCOFCOSZ"
     "FCOSZ",
     "clip and step outside the `if`; scheduler and zero_grad inside it"},
    {Pitfall::partial_cycle_drop,
     "FFCOSZ"
     "FFCOSZ"
     "FZ",
     "the partial window is zeroed, not stepped"},
    {Pitfall::partial_cycle_leak,
     "FFCOSZ"
     "FFCOSZ"
     "F",
     "the partial window is neither stepped nor zeroed"},
    {Pitfall::scheduler_per_micro_step,
     "FSFCOZS"
     "FSFCOZS"
     "FCOZS",
     "the boundary's optimizer.step precedes its micro-step's scheduler.step"},
    {Pitfall::clip_per_micro_step,
     "FCFCOSZ"
     "FCFCOSZ"
     "FCOSZ",
     "clip after every backward"},
    // With one rank every DDP pitfall is inert (TwoRanks pins them).
    {Pitfall::ddp_token_mean_across_ranks, kCorrect, "one rank"},
    {Pitfall::ddp_uneven_shards, kCorrect, "one rank"},
    {Pitfall::ddp_no_sync_everywhere, kCorrect, "one rank"},
    {Pitfall::ddp_sync_every_micro_step, kCorrect, "one rank"},
    {Pitfall::ddp_clip_local_norm, kCorrect, "one rank"},
    {Pitfall::ddp_scheduler_per_rank, kCorrect, "one rank"},
    {Pitfall::window_boundary_off_by_one,
     "FCOSZ"
     "FFCOSZ"
     "FFCOSZ",
     "`if i % K == 0`: steps after micro-batches 0, 2 and 4"},
    {Pitfall::window_boundary_off_by_one_max_steps,
     "FCOSZ"
     "FFCOSZ"
     "FFCOSZ",
     "as window-boundary-off-by-one: no leftover, and 3 steps as planned "
     "(see WindowOffByOneMaxSteps)"},
    {Pitfall::scheduler_before_optimizer,
     "FFSCOZ"
     "FFSCOZ"
     "FSCOZ",
     "scheduler.step() right before clip and optimizer.step()"},
    {Pitfall::scheduler_per_epoch,
     "FFCOZ"
     "FFCOZ"
     "FCOZ"
     "S",
     "one scheduler.step() after the epoch's last window"},
    {Pitfall::skip_short_micro_batch, kCorrect,
     "b = 1 has no short micro-batch (see SkipShortMicroBatch)"},
    {Pitfall::token_count_unshifted_labels, kCorrect, "weights only"},
    // Without a GradScaler or an EMA these are inert or values only
    // (ScalerAndEma pins them with both).
    {Pitfall::low_precision_grad_buffer, kCorrect, "gradient values only"},
    {Pitfall::clip_before_unscale, kCorrect, "no scaler"},
    {Pitfall::scaler_update_every_micro_step, kCorrect, "no scaler"},
    {Pitfall::skipped_step_advances_scheduler, kCorrect, "no scaler"},
    {Pitfall::accumulator_rescaled, kCorrect, "gradient values only"},
    {Pitfall::ema_every_micro_step, kCorrect, "no EMA"},
    {Pitfall::optimizer_state_every_micro_step, kCorrect,
     "optimizer state values only"},
    {Pitfall::window_counter_across_epochs,
     "FFCOSZ"
     "FFCOSZ"
     "F",
     "steps at run micro-batches 2 and 4; the leftover is neither stepped "
     "nor zeroed (see TrainerBudget)"},
    {Pitfall::step_budget_drops_micro_batches,
     "FFCOSZ"
     "FFCOSZ",
     "budget 1 x floor(5 / 2) = 2 steps: micro-batch 4 never drawn"},
    {Pitfall::loss_divided_by_k_twice, kCorrect, "weights only"},
    {Pitfall::end_of_loader_syncs_every_micro_batch, kCorrect,
     "the last window holds one micro-batch (see EndOfLoader)"},
    {Pitfall::items_counted_per_fetch_group, kCorrect,
     "weights only, and only beside window-counter-across-epochs"},
    {Pitfall::last_fetch_sized_in_samples, kCorrect,
     "N mod K = 5 mod 2 = M mod K: every micro-batch drawn (see Fetches)"},
    {Pitfall::ddp_clip_before_all_reduce, kCorrect, "one rank"},
    {Pitfall::lr_scaled_by_k, kCorrect, "the lr only"},
    {Pitfall::scheduler_frequency_in_micro_batches, kCorrect,
     "frequency 1: every step schedules"},
    {Pitfall::window_buffer_across_epochs,
     "FFCOSZ"
     "FFCOSZ",
     "one epoch: micro-batch 4 waits in the buffer for a next epoch that "
     "never comes (never run)"},
    {Pitfall::window_sum_across_epochs,
     "FFCOSZ"
     "FFCOSZ"
     "F",
     "one epoch: micro-batch 4, the run's last leftover, is backwarded and "
     "never stepped"},
};

TEST(TrainerEvents, Correct) { EXPECT_EQ(pattern({}), kCorrect); }

TEST(TrainerEvents, EveryPitfallIsPinned) {
  for (Pitfall p : kAllPitfalls) {
    const Pinned* row = nullptr;
    for (const Pinned& r : kPinned)
      if (r.pitfall == p) row = &r;
    ASSERT_NE(row, nullptr) << pitfall_id(p) << " has no pinned call order";
    EXPECT_EQ(pattern({p}), row->pattern) << pitfall_id(p) << ": " << row->why;
  }
}

// With a GradScaler (U unscale_, G update) and an EMA (E), an overflow
// injected in window 1: its step is skipped (no O, no E) and the
// scheduler waits unless skipped-step-advances-scheduler.
TEST(TrainerEvents, ScalerAndEma) {
  Scenario s = five_micro_batches();
  s.precision.loss_scaling = true;
  s.precision.growth_interval = 2;
  s.precision.overflow = {{1, 0}};
  s.ema.enabled = true;
  s.ema.decay = 0.5;
  // One string a row, split at the optimizer steps' windows (kept as
  // written: clang-format would put each piece on a line of its own).
  // clang-format off
  const std::pair<std::vector<Pitfall>, const char*> rows[] = {
      {{}, "FFUCOGESZ" "FFUCGZ" "FUCOGESZ"},
      {{Pitfall::clip_before_unscale}, "FFCUOGESZ" "FFCUGZ" "FCUOGESZ"},
      {{Pitfall::scaler_update_every_micro_step},
       "FUGFUCOGESZ" "FUGFUCGZ" "FUCOGESZ"},
      {{Pitfall::skipped_step_advances_scheduler},
       "FFUCOGESZ" "FFUCGSZ" "FUCOGESZ"},
      {{Pitfall::ema_every_micro_step}, "FEFUCOGESZ" "FEFUCGZ" "FUCOGESZ"},
  };
  // clang-format on
  for (const auto& [p, want] : rows)
    EXPECT_EQ(pattern_of(s, p), want) << semantics_name(p);
  // The scale: 2^16, no growth after one clean step, back off at the
  // skip, then one more clean step.
  NullEngine e;
  Trainer<NullEngine> t(e, s, behavior_of({}), 0.1);
  const accumcheck::Run<double> run = t.run(make_plan(s), "x");
  std::vector<double> scales;
  for (const Event& ev : run.events)
    if (ev.kind == EventKind::scaler_update) scales.push_back(ev.loss_scale);
  EXPECT_EQ(scales, (std::vector<double>{65536.0, 32768.0, 32768.0}));
  EXPECT_EQ(t.counters().skipped_steps, 1);
}

// Two ranks: each rank records its own calls; DDP's all-reduce (A) once
// per stepped window, after the last micro-step's backwards.
TEST(TrainerEvents, TwoRanks) {
  EXPECT_EQ(ranks_pattern({}, 5, 2),
            "FFFFACCOOSSZZ"
            "FFFFACCOOSSZZ"
            "FFACCOOSSZZ");
  EXPECT_EQ(ranks_pattern({Pitfall::ddp_sync_every_micro_step}, 5, 2),
            "FFAFFACCOOSSZZ"
            "FFAFFACCOOSSZZ"
            "FFACCOOSSZZ")
      << "K all-reduces per step";
  EXPECT_EQ(ranks_pattern({Pitfall::ddp_no_sync_everywhere}, 5, 2),
            "FFFFCCOOSSZZ"
            "FFFFCCOOSSZZ"
            "FFCCOOSSZZ")
      << "no all-reduce at all";
  EXPECT_EQ(ranks_pattern({Pitfall::ddp_scheduler_per_rank}, 5, 2),
            "FFFFACCOOSSSSZZ"
            "FFFFACCOOSSSSZZ"
            "FFACCOOSSSSZZ")
      << "R scheduler.step() calls on each rank";
  for (Pitfall p : {Pitfall::ddp_uneven_shards, Pitfall::ddp_clip_local_norm})
    EXPECT_EQ(ranks_pattern({p}, 5, 2), ranks_pattern({}, 5, 2))
        << pitfall_id(p);
}

TEST(TrainerEvents, Seed002LoopStepsOncePerEpochWhenKDivides) {
  // 4 micro-batches, K = 2: one step per epoch, after the loop.
  EXPECT_EQ(pattern({Pitfall::seed_002_loop}, 4),
            "ZFZFZFZF"
            "COSZ");
}

TEST(TrainerEvents, KPerEpoch) {
  // K = 2 then 3 over two epochs of 5 micro-batches: windows [F F] [F F]
  // [F], then [F F F] [F F]; the ramp pitfalls keep that call order.
  Scenario s = five_micro_batches();
  s.batching.epochs = 2;
  s.batching.accumulation_per_epoch = {2, 3};
  const std::string want =
      "FFCOSZ"
      "FFCOSZ"
      "FCOSZ"
      "FFFCOSZ"
      "FFCOSZ";
  EXPECT_EQ(pattern_of(s, {}), want);
  for (Pitfall p : {Pitfall::ramp_normalization_stale,
                    Pitfall::ramp_schedule_horizon_fixed})
    EXPECT_EQ(pattern_of(s, {p}), want) << pitfall_id(p);
  // seed 002's loop steps after an epoch iff its own K divides it: 5 % 2
  // and 5 % 3 do not; with 6 micro-batches both do.
  EXPECT_EQ(pattern_of(s, {Pitfall::seed_002_loop}), "ZFZFZFZFZFZFZFZFZFZF");
  s.data.samples = 6;
  EXPECT_EQ(pattern_of(s, {Pitfall::seed_002_loop}),
            "ZFZFZFZFZFZFCOSZ"
            "ZFZFZFZFZFZFCOSZ");
}

TEST(TrainerEvents, WindowOffByOneLeaksTheLeftover) {
  // 4 micro-batches, K = 2: steps after 0 and 2; micro-batch 3 is neither
  // stepped nor zeroed (it would join the next epoch's first window).
  EXPECT_EQ(pattern({Pitfall::window_boundary_off_by_one}, 4),
            "FCOSZ"
            "FFCOSZ"
            "F");
}

TEST(TrainerEvents, WindowOffByOneMaxSteps) {
  // run_clm_no_trainer (2021): 4 micro-batches, K = 2, 2 epochs: windows
  // [0], [1, 2], [3] (the epoch's rest, stepped at its end): 3 steps per
  // epoch where max_train_steps = 2 x ceil(4 / 2) = 4, so epoch 1 breaks
  // after its first window; its other micro-batches are never drawn.
  Scenario s = five_micro_batches(4);
  s.batching.epochs = 2;
  EXPECT_EQ(pattern_of(s, {Pitfall::window_boundary_off_by_one_max_steps}),
            "FCOSZ"
            "FFCOSZ"
            "FCOSZ"
            "FCOSZ");
  // Without the break the same cut takes 6 steps.
  EXPECT_EQ(pattern_of(s, {Pitfall::window_boundary_off_by_one}),
            "FCOSZ"
            "FFCOSZ"
            "F"
            "FCOSZ"
            "FFCOSZ"
            "F");
}

TEST(TrainerEvents, EndOfLoader) {
  // 6 micro-batches, K = 2, 2 epochs: each epoch's last window [4, 5] is
  // stepped, scheduled and zeroed after each of its micro-batches (with
  // 2 ranks, 1 epoch: an all-reduce before each step); the others as
  // correct.
  Scenario s = five_micro_batches(6);
  s.batching.epochs = 2;
  const std::string epoch =
      "FFCOSZ"
      "FFCOSZ"
      "FCOSZ"
      "FCOSZ";
  EXPECT_EQ(pattern_of(s, {Pitfall::end_of_loader_syncs_every_micro_batch}),
            epoch + epoch);
  EXPECT_EQ(
      ranks_pattern({Pitfall::end_of_loader_syncs_every_micro_batch}, 6, 2),
      "FFFFACCOOSSZZ"
      "FFFFACCOOSSZZ"
      "FFACCOOSSZZ"
      "FFACCOOSSZZ");
}

TEST(TrainerEvents, TrainerBudget) {
  // Transformers' Trainer 4.45: 5 micro-batches, K = 2, 2 epochs.  The
  // counter across epochs cuts epoch 0 into [0, 1], [2, 3] and a leftover
  // [4] that joins epoch 1's [0]; then [1, 2], [3, 4]: 5 steps.  The
  // budget 2 x floor(5 / 2) = 4 stops the run after epoch 1's [1, 2].
  Scenario s = five_micro_batches(5);
  s.batching.epochs = 2;
  EXPECT_EQ(pattern_of(s, {Pitfall::window_counter_across_epochs}),
            "FFCOSZ"
            "FFCOSZ"
            "F"
            "FCOSZ"
            "FFCOSZ"
            "FFCOSZ");
  EXPECT_EQ(pattern_of(s, {Pitfall::window_counter_across_epochs,
                           Pitfall::step_budget_drops_micro_batches}),
            "FFCOSZ"
            "FFCOSZ"
            "F"
            "FCOSZ"
            "FFCOSZ");
  // The budget alone (windows per epoch, the partial one stepped):
  // 3 steps in epoch 0, epoch 1 stops after its first window.
  EXPECT_EQ(pattern_of(s, {Pitfall::step_budget_drops_micro_batches}),
            "FFCOSZ"
            "FFCOSZ"
            "FCOSZ"
            "FFCOSZ");
  // An epoch of M <= K micro-batches is stepped at its end (the
  // Trainer's is_last_step_and_steps_less_than_grad_acc).
  Scenario one = five_micro_batches(1);
  one.batching.epochs = 2;
  EXPECT_EQ(pattern_of(one, {Pitfall::window_counter_across_epochs}),
            "FCOSZ"
            "FCOSZ");
}

TEST(TrainerEvents, WindowBuffer) {
  // A window buffer not reset at the epoch's end: 5 micro-batches, K = 2,
  // 2 epochs.  Epoch 0 steps [0, 1], [2, 3] and keeps [4] unrun; epoch 1
  // runs it with its own [0], then [1, 2], [3, 4]: 5 steps, the leftover's
  // backward in epoch 1 (window-counter-across-epochs runs it in epoch 0).
  Scenario s = five_micro_batches(5);
  s.batching.epochs = 2;
  EXPECT_EQ(pattern_of(s, {Pitfall::window_buffer_across_epochs}),
            "FFCOSZ"
            "FFCOSZ"
            "FFCOSZ"
            "FFCOSZ"
            "FFCOSZ");
  // No epoch's end steps the buffer: 3 epochs of one micro-batch at K = 2
  // take one step, and the third epoch's micro-batch never runs.
  Scenario one = five_micro_batches(1);
  one.batching.epochs = 3;
  EXPECT_EQ(pattern_of(one, {Pitfall::window_buffer_across_epochs}), "FFCOSZ");
}

TEST(TrainerEvents, SkipShortMicroBatch) {
  // 5 samples, b = 2: micro-batches of 2, 2, 1; K = 2.  Correct steps the
  // short one in a partial window; drop_last never draws it.
  EXPECT_EQ(pattern({}, 5, 2),
            "FFCOSZ"
            "FCOSZ");
  EXPECT_EQ(pattern({Pitfall::skip_short_micro_batch}, 5, 2), "FFCOSZ");
  // Without a short micro-batch it changes nothing.
  EXPECT_EQ(pattern({Pitfall::skip_short_micro_batch}, 6, 2),
            pattern({}, 6, 2));
}

TEST(TrainerEvents, Fetches) {
  // Transformers' Trainer 4.46-4.51: fetches of K, the epoch's last one of
  // N mod K micro-batches (N samples).  10 samples, b = 2, K = 3: 5
  // micro-batches, 5 mod 3 = 2 left after the full fetch but 10 mod 3 = 1
  // drawn: micro-batch 4 never drawn, micro-batch 3 neither stepped nor
  // zeroed (the epoch's end never comes).
  Scenario s = five_micro_batches(10);
  s.batching.micro_batch = 2;
  s.batching.accumulation = 3;
  const Pitfall last = Pitfall::last_fetch_sized_in_samples;
  const Pitfall across = Pitfall::window_counter_across_epochs;
  EXPECT_EQ(pattern_of(s, {}),
            "FFFCOSZ"
            "FFCOSZ");
  EXPECT_EQ(pattern_of(s, {last}),
            "FFFCOSZ"
            "F");
  s.batching.epochs = 2;
  // Epoch 1's first window steps micro-batch 3 of epoch 0 with its own.
  EXPECT_EQ(pattern_of(s, {last}),
            "FFFCOSZ"
            "F"
            "FFFCOSZ"
            "F");
  // With the counter across epochs (4.46): the run's micro-batches 3 and
  // 6 end windows; epoch 1's drawn [2, 3] are left over.
  EXPECT_EQ(pattern_of(s, {across, last}),
            "FFFCOSZ"
            "F"
            "FFCOSZ"
            "FF");
  // items-counted-per-fetch-group changes weights, never the calls.
  EXPECT_EQ(pattern_of(s, {across, Pitfall::items_counted_per_fetch_group}),
            pattern_of(s, {across}));
  // An epoch of M <= K micro-batches (5 samples, b = 2, K = 4: 3 of them)
  // draws N mod K = 1 and never reaches its end, with or without the
  // counter across epochs (the Trainer's steps_in_epoch <= K rule).
  Scenario one = five_micro_batches(5);
  one.batching.micro_batch = 2;
  one.batching.accumulation = 4;
  EXPECT_EQ(pattern_of(one, {}), "FFFCOSZ");
  EXPECT_EQ(pattern_of(one, {last}), "F");
  EXPECT_EQ(pattern_of(one, {across, last}), "F");
  // N counts every rank's samples: 2 ranks of 10 samples, 20 mod 3 = 2 =
  // M mod K, so every micro-batch is drawn (one rank alone would not).
  Scenario two = five_micro_batches(20);
  two.batching.ranks = 2;
  two.batching.micro_batch = 2;
  two.batching.accumulation = 3;
  EXPECT_EQ(pattern_of(two, {last}), pattern_of(two, {}));
}

}  // namespace
}  // namespace accumcheck
