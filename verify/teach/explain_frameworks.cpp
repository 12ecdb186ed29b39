// `accumcheck explain`'s entries (verify/teach/explain_catalog.hpp): the
// pitfalls found in frameworks' own loops (issue 33): Hugging Face's
// examples and Trainer, accelerate, Keras, the optimizer's lr.
#include <span>

#include "verify/teach/explain_catalog.hpp"

namespace accumcheck::explain_catalog {

namespace {

constexpr ExplainEntry kFrameworkPitfalls[] = {
    {"window-boundary-off-by-one-max-steps",
     "`if step % K == 0 or step == len(loader) - 1` with max_train_steps",
     "Hugging Face's run_clm_no_trainer.py (2021) steps when `step % K == "
     "0 or step == len(train_dataloader) - 1` on a 0-based step and breaks "
     "once completed_steps reaches max_train_steps = epochs x ceil(len / "
     "K). The first window holds one micro-batch, the epoch's rest is "
     "stepped at its end, so an epoch takes one step more than planned "
     "(unless len = 1 mod K); the run reaches max_train_steps early and the "
     "last epochs stop after their first window, their other data unseen. "
     "The final step count looks right.",
     "     for step, batch in enumerate(train_dataloader):\n"
     "         loss = model(**batch).loss / K\n"
     "         accelerator.backward(loss)\n"
     "-        if step % K == 0 or step == len(train_dataloader) - 1:\n"
     "+        if (step + 1) % K == 0 or step == len(train_dataloader) - 1:\n"
     "             optimizer.step(); lr_scheduler.step(); "
     "optimizer.zero_grad()\n"
     "             completed_steps += 1\n"
     "         if completed_steps >= max_train_steps:\n"
     "             break",
     "windows [0], [1..K], ..., the epoch's rest; each micro-batch weighs "
     "1/(K*b_k); every epoch ends after the window whose step reaches "
     "epochs x ceil(micro-batches / K)",
     "window-boundary-off-by-one-max-steps",
     "transformers examples/pytorch/language-modeling/run_clm_no_trainer.py "
     "(2021, its step condition and max_train_steps break, copied widely); "
     "FIELD.md boundary arithmetic",
     "window.off-by-one-max-steps"},
    {"window-counter-across-epochs",
     "`if total % K == 0` on a counter that runs across epochs",
     "Transformers' Trainer 4.45 counts the micro-batches of the whole run "
     "(total_batched_samples) and steps when the count is a multiple of K. "
     "With M micro-batches per epoch not a multiple of K, an epoch's "
     "leftover micro-batches are neither stepped nor zeroed: they join the "
     "next epoch's first window, which takes only what completes K, and "
     "every later window of that epoch is shifted. The last epoch's "
     "leftover is never stepped.",
     "     for epoch in range(epochs):\n"
     "-        for batch in loader:            # total counts across epochs\n"
     "-            total += 1\n"
     "-            ...\n"
     "-            if total % K == 0:\n"
     "+        for i, batch in enumerate(loader):\n"
     "+            ...\n"
     "+            if (i + 1) % K == 0 or i + 1 == len(loader):\n"
     "                 optimizer.step(); optimizer.zero_grad()",
     "a step sums the micro-batches since the last one: the previous "
     "epoch's leftover and its own epoch's part, each part at 1/N over its "
     "items",
     "window-counter-across-epochs",
     "transformers 4.45.2 src/transformers/trainer.py "
     "_inner_training_loop: total_batched_samples = 0 before the epoch "
     "loop, `if total_batched_samples % args.gradient_accumulation_steps == "
     "0` (line 2411); 4.46.1 keeps it for the step decision (do_sync_step, "
     "line 2433); 4.47 counts per epoch (`(step + 1) % K == 0 or step + 1 == "
     "steps_in_epoch`); measured in docs/frameworks.md",
     "window.counter-across-epochs"},
    {"step-budget-drops-micro-batches",
     "training stops after epochs x floor(M/K) steps",
     "Transformers' Trainer 4.45 to 4.51 computes before training "
     "max_steps = ceil(num_train_epochs x max(len(dataloader) // K, 1)) and "
     "stops once global_step reaches it (DefaultFlowCallback sets "
     "should_training_stop). With M micro-batches per epoch not a multiple "
     "of K an epoch takes ceil(M/K) steps (its partial window stepped, or "
     "its leftover carried into the next epoch), so the budget runs out "
     "early: the last epoch's remaining micro-batches never enter an "
     "optimizer step. The same max_steps is the horizon the Trainer builds "
     "its scheduler with (create_optimizer_and_scheduler(num_training_steps"
     "=max_steps), a warmup_ratio taken of it too), so a linear or cosine "
     "schedule decays over the budget: past the warmup each step's lr is "
     "lower than over the steps the data makes (a warmup_ratio's warmup is "
     "shorter too), and the curve looks complete when the run stops. One "
     "variable, so the two "
     "come and go together: a scheduler the user builds and passes in keeps "
     "its own horizon.",
     "-num_update_steps_per_epoch = max(len_dataloader // K, 1)\n"
     "+num_update_steps_per_epoch = max(math.ceil(len_dataloader / K), 1)\n"
     " max_steps = math.ceil(num_train_epochs * num_update_steps_per_epoch)",
     "steps = epochs x max(1, floor(M / K)), correct: epochs x ceil(M / K); "
     "the windows before the stop are the loop's own; a linear or cosine "
     "schedule's horizon is the budget (a warmup ratio taken of it)",
     "step-budget-drops-micro-batches step-budget-drops-micro-batches-cosine",
     "transformers src/transformers/trainer.py _inner_training_loop: "
     "`num_update_steps_per_epoch = len_dataloader // "
     "args.gradient_accumulation_steps` (4.45.2 line 2095, 4.46.1 line "
     "2165, 4.47.1 line 2207) and `max_steps = math.ceil(args.num_train_"
     "epochs * num_update_steps_per_epoch)`, then "
     "`self.create_optimizer_and_scheduler(num_training_steps=max_steps)` "
     "(4.46.1 line 2223) and `get_warmup_steps(num_training_steps)` for a "
     "warmup_ratio; reported in transformers #31677 "
     "(2024, epochs and max_steps mismatch under accumulation) and #37777 "
     "(2025); fixed by PR #37923 (4.52: len_dataloader // K + "
     "int(len_dataloader % K > 0)); measured in docs/frameworks.md",
     "window.step-budget"},
    // Mistakes only a framework's loop makes (issue 33).
    {"loss-divided-by-k-twice", "the loss divided by K twice: 1/K^2",
     "The framework divides every micro-batch's loss by K itself "
     "(Accelerate's accelerator.backward, DeepSpeed's engine.backward "
     "unless scale_wrt_gas=False, Lightning's automatic optimization), and "
     "the user, following the plain PyTorch recipe, divided it by K "
     "already. Every step's gradient is 1/K of the large batch's: SGD "
     "trains at lr/K, Adam almost hides it (its update is scale-free up to "
     "eps), clipping that engages hides it. The framework also divides a "
     "short last window by K: with a partial window the trace is "
     "loss-divided-by-k-twice+partial-cycle-scale-by-k.",
     "     with accelerator.accumulate(model):\n"
     "-        loss = criterion(model(x), y) / K\n"
     "+        loss = criterion(model(x), y)   # backward divides by K\n"
     "         accelerator.backward(loss)\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "every weight the loop gives divided by K once more: G = g/K on full "
     "windows of equal micro-batches; a partial window of r micro-batches "
     "weighs 1/(K*N_w) alone, 1/(K^2*b_k) with partial-cycle-scale-by-k",
     "loss-divided-by-k-twice",
     "accelerate #3533 (double divide gradient_accumulation_steps), "
     "transformers #40709 and #26312, DeepSpeed #7439 (engine.backward "
     "scales by gradient_accumulation_steps itself), transformers PR "
     "#35808, Megatron-DeepSpeed PR #42 (grad accum double scaling); "
     "accelerate's Accelerator.backward (loss / gradient_accumulation_steps)",
     "framework.loss-divided-by-k-twice"},
    {"end-of-loader-syncs-every-micro-batch",
     "accumulate() at the end of the loader steps every micro-batch",
     "Accelerate's accumulate() syncs and lets optimizer.step() through "
     "when the prepared DataLoader is at its end (GradientState's "
     "end_of_dataloader), and the loader sets that flag when it hands out "
     "the epoch's last batch (it reads one batch ahead). A loop that draws "
     "its window of K batches first (to count the window's tokens, as the "
     "Trainer does) has drawn the last batch before the last window's "
     "first micro-batch: every micro-batch of that window is synced, "
     "stepped and zeroed alone, with the weight meant for the whole "
     "window. Correct takes one step per window; this takes K in each "
     "epoch's last one.",
     "     window = list(itertools.islice(it, K))   # drawn first\n"
     "     for batch in window:\n"
     "-        with accelerator.accumulate(model):\n"
     "-            accelerator.backward(loss(batch) * K / N_w)\n"
     "-            optimizer.step(); optimizer.zero_grad()\n"
     "+        accelerator.backward(loss(batch) * K / N_w)   # no_sync but "
     "the last\n"
     "+    optimizer.step(); optimizer.zero_grad()         # after the window",
     "windows before each epoch's last: as correct; the last window of r "
     "micro-batches: r steps, step k holding micro-batch k alone with its "
     "weight in the window (1/N_w)",
     "end-of-loader-syncs-every-micro-batch",
     "accelerate data_loader.py (end_of_dataloader set when the last batch "
     "is yielded) and Accelerator._do_sync; FIELD.md: accumulate() decides "
     "sync_gradients from a step counter and the end of a prepared "
     "DataLoader; accumcheck tests/frameworks/accelerate_lm.py "
     "prefetch_accumulate",
     "framework.end-of-loader"},
    // Transformers' Trainer 4.46-4.51's fetches (issue 33).
    {"items-counted-per-fetch-group",
     "items counted per fetch, the step decided across epochs",
     "Transformers' Trainer 4.46 draws each epoch's batches K at a time "
     "from the epoch's start (get_batch_samples) and divides every loss in "
     "a fetch by the fetch's label tokens (num_items_in_batch), but decides "
     "the step on a counter that runs across epochs "
     "(window-counter-across-epochs). An epoch's leftover then joins the "
     "next epoch's first fetch only partly: the step across the boundary "
     "holds the leftover (its own fetch) and the head of a fetch whose "
     "tokens it only partly holds, and the next step holds that fetch's "
     "tail and the head of the one after. Each micro-batch is divided by "
     "its fetch's count where correct divides by its step's. Wherever "
     "every step is one fetch (a counter per epoch) it changes nothing, so "
     "it is judged beside window-counter-across-epochs only.",
     "     for epoch in range(epochs):\n"
     "         for fetch in fetches(loader, K):   # K batches from the epoch's "
     "start\n"
     "             N = count_items(fetch)\n"
     "             for batch in fetch:\n"
     "-                total += 1                 # counts across epochs\n"
     "                 backward(loss_sum(batch) / N)\n"
     "-                if total % K == 0:\n"
     "-                    optimizer.step(); optimizer.zero_grad()\n"
     "+            optimizer.step(); optimizer.zero_grad()   # a step per "
     "fetch",
     "a step sums the micro-batches since the last one, each divided by the "
     "items of its fetch (the epoch's K-slices from its start), "
     "1/N_fetch where correct gives 1/N_w; with ddp-token-mean-across-ranks "
     "each rank's own fetch count",
     "items-counted-per-fetch-group",
     "transformers 4.46.1 src/transformers/trainer.py _inner_training_loop: "
     "`batch_samples, num_items_in_batch = self.get_batch_samples("
     "epoch_iterator, num_batches)` per fetch of K (line 2426) with "
     "`do_sync_step = ... total_batched_samples % "
     "args.gradient_accumulation_steps == 0` (line 2433); 4.47 steps per "
     "epoch (`(step + 1) % K == 0 or step + 1 == steps_in_epoch`), so its "
     "steps are its fetches; transformers #34198 (the fetches), #37777; "
     "measured in docs/frameworks.md",
     "window.items-per-fetch-group"},
    {"last-fetch-sized-in-samples",
     "the epoch's last fetch sized N mod K in samples",
     "Transformers' Trainer 4.46 to 4.51 draws each epoch in fetches of K "
     "batches and sizes the last one remainder = num_examples % K, "
     "num_examples being the dataset's samples, not the epoch's batches. "
     "With M batches per epoch and N mod K < M mod K the last M mod K - "
     "(N mod K) batches are never drawn, and the step at the epoch's last "
     "batch (`step + 1 == steps_in_epoch`) never comes: the drawn rest is "
     "neither stepped nor zeroed and joins the next epoch's first window "
     "(the last epoch's is never stepped). Where N mod K >= M mod K (or M "
     "is a multiple of K) it changes nothing.",
     "-remainder = num_examples % K              # samples\n"
     "+remainder = steps_in_epoch % K            # batches\n"
     " if remainder == 0:\n"
     "     remainder = K\n"
     " for update_step in range(total_updates):\n"
     "     n = K if update_step != total_updates - 1 else remainder\n"
     "     batches, N = get_batch_samples(epoch_iterator, n)",
     "each epoch draws K*floor(M/K) + min(N mod K, M mod K) micro-batches "
     "(N mod K = 0 read as K); a last window cut short is not stepped at "
     "the epoch's end: its gradient joins the next window, each part at "
     "1/N over its own items",
     "last-fetch-sized-in-samples",
     "transformers #37777 (2025: `num_examples is the number of examples "
     "... not the number of batches ... so the remainer is incorrect`), "
     "fixed by PR #37923 (4.52, which names #34198 as its origin); "
     "transformers 4.46.1 trainer.py line 2417, 4.47.1 line 2465, 4.51.3 "
     "line 2504; FIELD.md (#37777, the epoch's remainder windows); measured "
     "in docs/frameworks.md",
     "window.last-fetch-in-samples"},
    {"ddp-clip-before-all-reduce",
     "each rank clips its local gradient before a hand-written all-reduce",
     "A loop that averages the gradients by hand (the window under no_sync, "
     "or the plain module, then all_reduce(p.grad, SUM) and / R) and "
     "calls clip_grad_norm_ before that all-reduce clips each rank's own "
     "local gradient by its own norm: each rank's share is scaled by a "
     "different factor, so the averaged gradient is neither the large "
     "batch's nor clipped to max_norm. Clip after the all-reduce, on the "
     "averaged gradient (the same on every rank).",
     " with model.no_sync():\n"
     "     for batch in window: (loss(batch) / N_w).backward()\n"
     "-torch.nn.utils.clip_grad_norm_(model.parameters(), c)  # local\n"
     " for p in model.parameters():\n"
     "     dist.all_reduce(p.grad, op=dist.ReduceOp.SUM); p.grad /= R\n"
     "+torch.nn.utils.clip_grad_norm_(model.parameters(), c)  # averaged",
     "G = (1/R) sum_r s_r g_r with s_r = min(1, c/(|g_r| + 1e-6)) of rank "
     "r's local window gradient g_r, instead of s (1/R) sum_r g_r with s "
     "of the averaged gradient",
     "ddp-clip-before-all-reduce",
     "issue 44: a DDP battery's loop with a local clip before the "
     "torch.distributed tutorial's average_gradients; CTest "
     "PyTorch.contract.ddp.clip_then_average, "
     "PyTorch.ddp.clip_then_average.certify-ddp-2",
     "inertness.ddp"},
    {"lr-scaled-by-k", "the optimizer built with lr * K",
     "The linear scaling rule (a batch K times larger wants a K times larger "
     "lr) applied to accumulation: the optimizer is built with lr * K. But "
     "correct accumulation at the large batch's lr already is the large "
     "batch, so every step runs at K times the lr you meant, with the "
     "schedule's shape unchanged. With plain SGD (no momentum, no weight "
     "decay, no clip) its parameters are those of a missing /K "
     "(no-loss-normalization); the gradients and the recorded lr tell "
     "them apart. "
     "Keep the lr: the one lesson lr-scaling shows.",
     "-optimizer = SGD(model.parameters(), lr=lr * K)   # seed 003\n"
     "+optimizer = SGD(model.parameters(), lr=lr)\n"
     " scheduler = StepLR(optimizer, step_size, gamma)  # built over it",
     "every step's lr is K x S(t) (S: the schedule over the lr you meant), "
     "the gradients correct's",
     "lr-scaled-by-k",
     "seed 003 (scale the lr by K); issue 44 (an lr * K written into the "
     "optimizer before the scheduler was built, stated with lr=); the "
     "schedule.lr_times_k cells of CTest Frameworks.accelerate.1.15.0 and "
     "Frameworks.lightning.2.6.6",
     "loss-normalization.sgd-at-k-lr"},
    {"scheduler-frequency-in-micro-batches",
     "the scheduler's frequency counted in micro-batches",
     "A scheduler declared to step every f optimizer steps (Lightning's "
     "lr_scheduler config {\"interval\": \"step\", \"frequency\": f}) is "
     "stepped after a window only when the number of the window's last "
     "micro-batch in its epoch is a multiple of f: Lightning tests "
     "(batch_idx + 1) % frequency, batch_idx counting micro-batches from "
     "the epoch's start. With f dividing K every window ends on such a "
     "micro-batch and the scheduler steps after every optimizer step, f "
     "times too often; otherwise it steps after the windows that happen "
     "to end on one, a count that starts again each epoch. Count the frequency "
     "in optimizer steps (a "
     "scheduler of its own cadence, stepped in on_train_batch_end), or "
     "fold f into the scheduler's lengths with frequency 1.",
     " if not accumulating:                      # the window's last "
     "micro-batch\n"
     "-    if (batch_idx + 1) % frequency == 0:  # Lightning, #17544\n"
     "+    if global_step % frequency == 0:      # optimizer steps taken\n"
     "         scheduler.step()",
     "step t uses S(c_t), c_t the earlier steps whose window ended on a "
     "micro-batch numbered a multiple of f in its epoch (correct: "
     "floor(t / f))",
     "scheduler-frequency-in-micro-batches",
     "Lightning #17544 (2.0.9-2.6.6: _update_learning_rates' current_idx "
     "is batch_idx + 1); issue 44; the conformance matrix's lightning "
     "schedule.freq2_k4 cell, CTest Frameworks.lightning.2.6.6 "
     "(schedule.freq2), PyTorch.contract.gpt.step_freq2_micro",
     "scheduler.order"},
};

}  // namespace

std::span<const ExplainEntry> framework_pitfalls() {
  return kFrameworkPitfalls;
}

}  // namespace accumcheck::explain_catalog
