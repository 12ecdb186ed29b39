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
// reach epochs x max(1, floor(micro-steps of epoch 0 / K)), the horizon
// of its linear or cosine schedule too;
// last-fetch-sized-in-samples draws only N mod K micro-batches (N the
// epoch's samples) of the epoch's last fetch, the drawn rest of a window
// the epoch never finishes neither stepped nor zeroed.
// items-counted-per-fetch-group divides each micro-batch by the items of
// its fetch (the epoch's K-slices from its start, as drawn) instead of its
// window's.  window-buffer-across-epochs carries an epoch's leftover
// micro-batches unrun into the next epoch and cuts the run's micro-batches
// in K from the run's start (buffered_epoch): the joined window is one
// window, counted whole (N_w over both epochs' parts); the run's last
// leftover never runs.  window-sum-across-epochs carries it too, joined
// to the next epoch's first full window (joined_epoch: K + r micro-batches
// counted whole); the run's last leftover runs and is never stepped.
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
//
// The parts: sim/trainer_options.hpp (counters, options, base_lr),
// sim/trainer_draw.hpp (the windows a pitfall draws or cuts itself),
// sim/trainer_loop.hpp (the class: the run, the window, the loss
// weights), sim/trainer_ranks.hpp (the ranks, the all-reduce),
// sim/trainer_step.hpp (loss scaling, EMA, clip, the optimizer and
// scheduler steps).  Engines and everything else include this header.
#pragma once

#include "sim/trainer_draw.hpp"
#include "sim/trainer_loop.hpp"
#include "sim/trainer_options.hpp"
#include "sim/trainer_ranks.hpp"
#include "sim/trainer_step.hpp"
