// `accumcheck explain`'s entries (verify/teach/explain_catalog.hpp): the
// pitfalls of a hand-written accumulation loop, from the seed documents
// and the field reports (/work/shared/FIELD.md, by repository #issue).
#include <span>

#include "verify/teach/explain_catalog.hpp"

namespace accumcheck::explain_catalog {

namespace {

constexpr ExplainEntry kLoopPitfalls[] = {
    {"no-loss-normalization", "the loss is not divided by K",
     "The trainer sums K micro-batch gradients but never divides the loss by "
     "K, so every optimizer step sees K times the large batch's gradient. "
     "Plain SGD then trains at K times the learning rate; Adam almost hides "
     "it (its update is scale-free up to eps). Seed 001 calls it the most "
     "common mistake.",
     " for i, (x, y) in enumerate(loader):\n"
     "-    loss = criterion(model(x), y)\n"
     "+    loss = criterion(model(x), y) / K\n"
     "     loss.backward()\n"
     "     if (i + 1) % K == 0:\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "G = K * g (g = the large batch's gradient); SGD without weight decay or "
     "clipping: exactly correct at K*lr; Adam: correct with eps/K",
     "no-loss-normalization",
     "seed 001 (pitfall 1: forgetting loss / accumulation_steps); FIELD.md: "
     "clipping can hide a missing /K when it engages at every step",
     "loss-normalization.no-loss-normalization loss-normalization.sgd-at-k-lr "
     "loss-normalization.adam-eps-over-k difference.device"},
    {"sample-mean-of-means", "micro-batch means averaged over K",
     "Each micro-batch loss is its own mean, divided by K. With micro-batches "
     "of unequal size (a short last micro-batch, packed or bucketed data) a "
     "sample in a small micro-batch weighs more than one in a large one: the "
     "window is no longer the large batch's mean.",
     "-    loss = criterion(model(x), y) / K            # mean over b_k, then "
     "/K\n"
     "+    loss = criterion_sum(model(x), y) / N_w      # N_w: items in the "
     "window\n"
     "     loss.backward()",
     "a sample of micro-batch k weighs 1/(K*b_k) instead of 1/N_w; equal to "
     "correct when every b_k is equal",
     "sample-mean-of-means",
     "the Lightning/Accelerate `loss / K` loop on unequal micro-batches "
     "(on a short last window: partial-cycle-scale-by-k); seed 001's loss / K "
     "rule",
     "loss-normalization.sample-mean-of-means inertness.oracle"},
    {"token-mean-of-means", "per-micro-batch token means averaged over K",
     "The 2024 Transformers gradient-accumulation bug: each micro-batch's "
     "cross-entropy is a mean over its own tokens, then divided by K. With "
     "sequences of different lengths, a token in a short micro-batch weighs "
     "more. The fix counts the window's tokens first (num_items_in_batch).",
     "-    loss = F.cross_entropy(logits, y, ignore_index=-100) / K\n"
     "+    loss = F.cross_entropy(logits, y, ignore_index=-100,\n"
     "+                           reduction='sum') / num_items_in_window",
     "a token of micro-batch k weighs 1/(K*T_k) instead of 1/T (T: the "
     "window's tokens); equal to correct when every T_k is equal",
     "token-mean-of-means token-mean-of-means-fixed",
     "transformers #34242 (and its DP form: torchtitan #1842/#2206, "
     "Megatron-LM #7452: gradient 14/3 vs 4)",
     "token.mean-of-means-weights token.mean-of-means-equal-lengths-is-correct "
     "token.correct-equals-large-batch device.token"},
    {"zero-grad-every-micro-step",
     "zero_grad at the top of the micro-batch loop",
     "optimizer.zero_grad() runs before every backward, so each window's "
     "accumulated gradient is only its last micro-batch's: K-1 of every K "
     "micro-batches are computed and thrown away. Seed 002's own "
     "accumulation code does this.",
     " for i, (x, y) in enumerate(loader):\n"
     "-    optimizer.zero_grad()\n"
     "     loss = criterion(model(x), y) / K\n"
     "     loss.backward()\n"
     "     if (i + 1) % K == 0:\n"
     "-        optimizer.step()\n"
     "+        optimizer.step(); optimizer.zero_grad()",
     "G = grad L_K / N_w: the last micro-batch only (= grad L_K / K for equal "
     "micro-batches)",
     "zero-grad-every-micro-step",
     "seed 002 (its 'gradient accumulation' loop); seed 001 (pitfall 2: "
     "zero_grad during accumulation)",
     "zero-grad.every-micro-step inertness.oracle difference.device"},
    {"seed-002-loop",
     "seed 002's loop verbatim: zero_grad inside, the step `if` after the loop",
     "Seed 002 zeroes inside the micro-batch loop and puts `if (i+1) % K == "
     "0: step()` after the loop, at epoch level. It steps once per epoch "
     "with the last micro-batch's gradient / K, and only when K divides the "
     "epoch's micro-batch count; otherwise it never steps at all.",
     " for epoch in range(E):\n"
     "     for i, (x, y) in enumerate(loader):\n"
     "-        optimizer.zero_grad()\n"
     "         loss = criterion(model(x), y) / K\n"
     "         loss.backward()\n"
     "-    if (i + 1) % K == 0:\n"
     "-        optimizer.step()\n"
     "+        if (i + 1) % K == 0:\n"
     "+            optimizer.step(); optimizer.zero_grad()",
     "one step per epoch with grad L_last / K iff K divides the epoch's "
     "micro-batches; zero steps otherwise",
     "seed-002-loop seed-002-loop-never-steps",
     "seed 002; FIELD.md boundary arithmetic: never steps when epoch < K "
     "(Open-Sora #906, Lightning #21808, dp-transformers #23)",
     "zero-grad.seed-002-loop inertness.oracle"},
    {"zero-grad-never", "gradients are never zeroed",
     "The trainer forgets zero_grad entirely: every window's gradient adds "
     "onto all previous ones, each taken at its own parameters. The "
     "effective step grows with training like a momentum of 1.",
     "     if (i + 1) % K == 0:\n"
     "-        optimizer.step()\n"
     "+        optimizer.step(); optimizer.zero_grad()",
     "G_t = sum over s <= t of g_s, each g_s at its own theta_s",
     "zero-grad-never", "seed 001 (zero_grad only after the step)",
     "zero-grad.never inertness.oracle"},
    {"step-every-micro-step", "optimizer.step outside the `if`",
     "zero_grad sits in the `if`, but step() runs after every backward: the "
     "optimizer takes K updates per window on the growing partial sums, and "
     "Adam's step counter counts micro-steps.",
     "     loss.backward()\n"
     "-    optimizer.step()\n"
     "     if (i + 1) % K == 0:\n"
     "+        optimizer.step()\n"
     "         optimizer.zero_grad()",
     "K updates per window, update k on (1/N_w) sum_{j<=k} grad L_j; Adam's t "
     "advances K times per window",
     "step-every-micro-step",
     "FIELD.md: sharded engines treat every backward as the boundary "
     "(open-instruct #1498, Megatron-LM #7186, DeepSpeed #7985); optimizer "
     "internals per micro-step (keras #19990/#19998)",
     "zero-grad.step-every-micro-step inertness.oracle"},
    {"partial-cycle-scale-by-k", "the short last window still divides by K",
     "When K does not divide the epoch's micro-batches, the last window has "
     "r < K of them; dividing by K anyway shrinks its gradient by r/K. "
     "Lightning and Accelerate do this.",
     "-    loss = criterion(model(x), y) / K\n"
     "+    k_w = min(K, n_micro - (i // K) * K)   # micro-batches in this "
     "window\n"
     "+    loss = criterion(model(x), y) / k_w",
     "in the partial window G = (1/K) sum_{k<=r} grad L_k (correct: 1/N_w)",
     "partial-cycle-scale-by-k",
     "seed 003 (handle the last partial cycle); DESIGN.md: Lightning and "
     "Accelerate",
     "partial.scale-by-k partial.correct-weighs-1-over-n inertness.oracle"},
    {"partial-cycle-drop", "the short last window is never stepped",
     "The trainer only steps on `(i + 1) % K == 0`, so a partial last window "
     "is computed and zeroed without a step: its samples are unseen every "
     "epoch. Some teams accept this on purpose (partial-cycle-drop-accepted "
     "declares it; certify then judges against it).",
     "     if (i + 1) % K == 0 or i + 1 == len(loader):\n"
     "-    if (i + 1) % K == 0:\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "the partial window's samples never reach the parameters",
     "partial-cycle-drop partial-cycle-drop-accepted",
     "seed 003 (handle the last partial cycle); FIELD.md boundary arithmetic "
     "(Lightning #21808)",
     "partial.drop partial.correct-weighs-1-over-n inertness.oracle"},
    {"partial-cycle-leak", "leftover gradients leak into the next epoch",
     "No step and no zero_grad at the end of an epoch, and the window counter "
     "restarts: the leftover micro-batches' gradients join the next epoch's "
     "first window, which then holds r + K micro-batches.",
     "     for i, (x, y) in enumerate(loader):\n"
     "         ...\n"
     "-    # epoch ends: the leftovers stay in .grad\n"
     "+    if len(loader) % K:                      # flush the partial "
     "window\n"
     "+        optimizer.step(); optimizer.zero_grad()",
     "the next epoch's first window is G = (sum of r + K micro-batch "
     "gradients) with their own weights",
     "partial-cycle-leak",
     "seed 003; FIELD.md boundary arithmetic: resume offsets (Open-Sora #906)",
     "partial.leak inertness.oracle"},
    {"scheduler-per-micro-step", "scheduler.step() every micro-batch",
     "The lr scheduler is stepped after every backward instead of after "
     "every optimizer step, so the schedule runs K times too fast: warmup "
     "ends early and decay comes K times sooner.",
     "     loss.backward()\n"
     "-    scheduler.step()\n"
     "     if (i + 1) % K == 0:\n"
     "         optimizer.step()\n"
     "+        scheduler.step()\n"
     "         optimizer.zero_grad()",
     "optimizer step t uses S(t*K + K - 1) instead of S(t)",
     "scheduler-per-micro-step",
     "seed 000 (the scheduler silently changed by accumulation); FIELD.md: "
     "scheduler stepped xR under DP (transformers #24088, accelerate #2926), "
     "skipped step still advances it (pytorch #36601, transformers #23935)",
     "scheduler.drift inertness.oracle"},
    {"schedule-horizon-in-micro-steps",
     "warmup and horizon counted in micro-batches",
     "The schedule's total and warmup lengths are computed from the number "
     "of micro-batches (len(loader) * epochs) while it is stepped once per "
     "optimizer step: the schedule runs K times too slowly and never "
     "finishes its decay.",
     "-total = len(loader) * epochs\n"
     "+total = math.ceil(len(loader) / K) * epochs\n"
     " scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)",
     "step t uses S stretched K times: warmup and horizon K times longer",
     "schedule-horizon-in-micro-steps",
     "seed 000 (scheduler drift); FIELD.md: K declared twice (accelerate "
     "#995, DeepSpeed #1107)",
     "scheduler.drift inertness.oracle"},
    {"clip-per-micro-step", "clip_grad_norm_ after every backward",
     "Clipping runs on the running sum after each micro-batch instead of "
     "once on the window's gradient before the step. Whenever a partial sum "
     "exceeds the threshold the window's direction changes; seed 003 says "
     "to clip once after all micro-batches.",
     "     loss.backward()\n"
     "-    clip_grad_norm_(model.parameters(), c)\n"
     "     if (i + 1) % K == 0:\n"
     "+        clip_grad_norm_(model.parameters(), c)\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "G <- clip(G + grad L_k / N_w) after each micro-step; equal to correct "
     "when no partial sum before the last exceeds c",
     "clip-per-micro-step",
     "seed 003 (clip once after all micro-batches); FIELD.md: accumulator "
     "bugs hidden by clipping (Megatron-LM #6660)",
     "clip.per-micro-step inertness.oracle"},
    {"l2-in-loss-unnormalized",
     "L2 penalty added to every micro-loss without /K",
     "An explicit lambda*|theta|^2/2 term is added to each micro-batch loss "
     "after the division by K, so the window's gradient carries K copies "
     "of the decay: weight decay K times too strong.",
     "-    loss = criterion(model(x), y) / K + lam * l2(model) / 2\n"
     "+    loss = (criterion(model(x), y) + lam * l2(model) / 2) / K",
     "G = g + K * lambda * theta (correct: g + lambda * theta)",
     "l2-in-loss-unnormalized",
     "FIELD.md: optimizer internals per micro-step, decoupled wd (keras "
     "#19990/#19998)",
     "decay.l2-in-loss-unnormalized decay.adamw-once-per-step "
     "inertness.oracle"},
    {"window-boundary-off-by-one", "`if step % K == 0` on a 0-based counter",
     "Seeds 002 and 004 print `if step % accumulation_steps == 0` with a "
     "step counter that starts at 0. The first window then holds one "
     "micro-batch, every later window is shifted by one, and the epoch's "
     "leftover micro-batches are neither stepped nor zeroed: they leak into "
     "the next epoch's first window.",
     " for i, (x, y) in enumerate(loader):\n"
     "     loss = criterion(model(x), y) / K\n"
     "     loss.backward()\n"
     "-    if i % K == 0:\n"
     "+    if (i + 1) % K == 0:\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "windows [0], [1..K], [K+1..2K], ...; each micro-batch weighs 1/(K*b_k) "
     "(the first window 1/K of one micro-batch); leftovers join the next "
     "epoch's first window",
     "window-boundary-off-by-one",
     "seeds 002 and 004 (their printed loops); FIELD.md boundary arithmetic "
     "(Open-Sora #906, Lightning #21808, dp-transformers #23: steps on the "
     "first micro-step)",
     "window.off-by-one inertness.oracle"},
    {"scheduler-before-optimizer", "scheduler.step() before optimizer.step()",
     "The boundary calls scheduler.step() first, so every optimizer step "
     "uses the learning rate meant for the next one: warmup ends a step "
     "early and the first step never sees S(0). PyTorch warns about this "
     "order once; the lr channel of certify names it from the recorded lr.",
     "     if (i + 1) % K == 0:\n"
     "-        scheduler.step()\n"
     "         optimizer.step()\n"
     "+        scheduler.step()\n"
     "         optimizer.zero_grad()",
     "step t uses lr S(t+1) instead of S(t); the gradients are correct's",
     "scheduler-before-optimizer",
     "PyTorch 1.13 facts (lr_scheduler.step() before optimizer.step() "
     "warns); FIELD.md scheduler ordering under AMP (accelerate #4242)",
     "scheduler.order"},
    {"scheduler-per-epoch", "scheduler.step() once per epoch",
     "A schedule written in optimizer steps (warmup, cosine, linear decay) "
     "is stepped once per epoch instead of once per window: the lr is "
     "constant within each epoch and the schedule advances by epochs, so "
     "warmup lasts `warmup` epochs and the decay barely starts.",
     " for epoch in range(E):\n"
     "     for i, (x, y) in enumerate(loader):\n"
     "         ...\n"
     "         if (i + 1) % K == 0:\n"
     "-            optimizer.step(); optimizer.zero_grad()\n"
     "-    scheduler.step()\n"
     "+            optimizer.step(); scheduler.step(); optimizer.zero_grad()",
     "every step of epoch e uses lr S(e) instead of S(t)",
     "scheduler-per-epoch",
     "FIELD.md: schedulers stepped at the wrong rate (transformers #24088, "
     "accelerate #2926)",
     "scheduler.order"},
    {"skip-short-micro-batch",
     "DataLoader(drop_last=True): the short "
     "micro-batch is never seen",
     "With drop_last=True the epoch's short last micro-batch is never "
     "drawn: its samples never train, and the last window has one "
     "micro-batch less. Harmless when b divides the data set; otherwise a "
     "fixed set of samples (with shuffle: a changing one) is skipped every "
     "epoch.",
     "-loader = DataLoader(ds, batch_size=b, shuffle=True, drop_last=True)\n"
     "+loader = DataLoader(ds, batch_size=b, shuffle=True)  # normalize the\n"
     "+# short window by its own N_w",
     "the window's N_w counts only the micro-batches drawn; the short "
     "micro-batch's samples weigh 0",
     "skip-short-micro-batch certify-mlp-short",
     "FIELD.md boundary arithmetic; PyTorch 1.13 facts (record the order "
     "you see)",
     "data.skip-short-micro-batch"},
    {"token-count-unshifted-labels",
     "the token count includes each sequence's position 0",
     "The causal-LM loss compares logits at position i with labels[i+1], so "
     "position 0's label never bears a loss. A trainer that counts the "
     "window's tokens as labels.ne(-100) over the unshifted labels counts "
     "one token too many per sequence whose position 0 is not -100, and "
     "divides the summed token losses by that: every window is scaled by "
     "T/(T + S_w). Transformers 4.47 to 4.53 count so; 4.46 counted "
     "labels[..., 1:].",
     "-num_items = sum((b[\"labels\"].ne(-100)).sum() for b in window)\n"
     "+num_items = sum((b[\"labels\"][..., 1:].ne(-100)).sum() for b in "
     "window)\n"
     " loss = summed_token_loss / num_items   # positions 1..n-1",
     "every token weighs 1/(T + S_w) instead of 1/T (T: the window's "
     "loss-bearing tokens, S_w: its sequences); never equal to correct",
     "token-count-unshifted-labels",
     "transformers 4.47.1-4.53.3 trainer.py get_batch_samples: "
     "labels.ne(-100) (4.46.1: labels[..., 1:].ne(-100)); docs/frameworks.md "
     "conformance matrix",
     "token.unshifted-label-count-weights"},
    {"ramp-normalization-stale",
     "K ramps, the loss still divided by the "
     "first K",
     "Seed 002's cold start ramps K per epoch (`min(epoch * 2, 8)`), and "
     "large-model recipes ramp the batch. A loop that divides by the K it "
     "started with keeps `loss / K_0` after K changes: in every epoch whose "
     "K is not K_0 each step's gradient is K_e/K_0 times the window's mean.",
     " for epoch in range(E):\n"
     "+    K = accumulation_at(epoch)\n"
     "     for i, (x, y) in enumerate(loader):\n"
     "-        loss = criterion(model(x), y) / K0\n"
     "+        loss = criterion(model(x), y) / K",
     "where K_e != K_0: a sample of micro-batch k weighs 1/(K_0*b_k) "
     "instead of 1/N_w (K_e/K_0 x correct for equal micro-batches)",
     "ramp-normalization-stale seed-002-ramp seed-002-ramp-loop certify-ramp",
     "seed 002 (cold start: accumulation_steps = min(epoch * 2, 8)); "
     "Megatron-LM rampup-batch-size; GPT-3's batch ramp",
     "ramp.correct-equals-large-batch ramp.normalization-stale "
     "inertness.oracle"},
    {"ramp-schedule-horizon-fixed",
     "K ramps, the schedule's horizon counted "
     "with the first K",
     "A schedule's horizon in optimizer steps is epochs x ceil(M / K). "
     "Computed once with the initial K while K ramps up, it is too long: "
     "warmup and decay end late, and the last steps still run at a high "
     "lr (ramping down: too short, the lr reaches its floor early).",
     "-total = epochs * math.ceil(M / K0)\n"
     "+total = sum(math.ceil(M / accumulation_at(e)) for e in range(epochs))\n"
     " scheduler = get_cosine_schedule(optimizer, warmup, total)",
     "lr_t = S(t) of a schedule whose total (and warmup ratio) uses K_0 "
     "instead of the run's own step count",
     "ramp-schedule-horizon-fixed certify-ramp",
     "seed 002 (cold start ramp); the K-changing recipes (GPT-3, "
     "Megatron-LM rampup-batch-size)",
     "ramp.schedule-horizon-fixed"},
    // A hand-written window buffer (issue 44).
    {"window-buffer-across-epochs",
     "a window buffer that is not reset at the epoch's end",
     "The loop collects its window in a list (or a running window with its "
     "count) and, once it holds K micro-batches, counts their items, "
     "backwards each divided by that count and steps; the list is created "
     "before the epoch loop and not emptied at an epoch's end. With M "
     "micro-batches per epoch not a multiple of K the epoch's leftover "
     "waits, unrun, for the next epoch's first micro-batches: that window "
     "mixes two epochs, is divided by the items of the whole joined window, "
     "and every later window of the epoch is shifted; the last epoch's "
     "leftover is never backwarded. window-counter-across-epochs cuts the "
     "same windows but divides each epoch's part by its own items. Empty "
     "the buffer at each epoch's end: step what it holds as the epoch's "
     "short last window.",
     " pending = []\n"
     " for epoch in range(epochs):\n"
     "-    for batch in loader:                # pending outlives the epoch\n"
     "+    for i, batch in enumerate(loader):\n"
     "         pending.append(batch)\n"
     "-        if len(pending) == K:\n"
     "+        if len(pending) == K or i + 1 == len(loader):\n"
     "             N = sum(count_items(b) for b in pending)\n"
     "             for b in pending:\n"
     "                 (loss_sum(model, b) / N).backward()\n"
     "             optimizer.step(); optimizer.zero_grad(); pending = []",
     "the run's micro-batches cut in K from the run's start; each step "
     "sums its K micro-batches at 1/N over all their items, a window across "
     "an epoch's end included; the run's last leftover in no step",
     "window-buffer-across-epochs",
     "issue 44 (the new-user check's SFT loop: prompt-masked data, K = 4, "
     "the buffer `pending` filled across the epoch's end: FAIL unnamed "
     "before); CTest PyTorch.contract.sft.window_buffer; torchtune 0.6.1's "
     "recipe keeps its count and gradients across the epoch's end too, but "
     "restarts its window count (recipe.partial: the leftover joins a full "
     "window of K: window-sum-across-epochs)",
     "window.buffer-across-epochs"},
    // A recipe loop's running sum and count (issue 44).
    {"window-sum-across-epochs",
     "a running gradient sum and item count not reset at the epoch's end",
     "The loop backwards each micro-batch's summed loss as it comes, adds "
     "its items to a running count and, at `(idx + 1) % K == 0` on the "
     "epoch's own micro-batch index, scales the gradients by 1/count, "
     "steps, zeroes them and resets the count. Nothing happens at an "
     "epoch's end: with M micro-batches per epoch not a multiple of K the "
     "epoch's r = M mod K leftover micro-batches stay in .grad and in the "
     "count, and the index restarts, so the next epoch's first step sums "
     "K + r micro-batches of two epochs over all their items; the epoch's "
     "later windows are cut as correct cuts them, and the last epoch's "
     "leftover is backwarded and never stepped. window-buffer-across-epochs "
     "waits to fill K instead (every later window shifted); "
     "partial-cycle-leak divides the leftover by K. Step the epoch's short "
     "last window at its end.",
     " for epoch in range(epochs):\n"
     "     for idx, batch in enumerate(loader):\n"
     "         n = count_items(batch); num_tokens += n\n"
     "         (loss_mean(model, batch) * n).backward()\n"
     "-        if (idx + 1) % K == 0:\n"
     "+        if (idx + 1) % K == 0 or idx + 1 == len(loader):\n"
     "             scale_grads(model, 1 / num_tokens)\n"
     "             optimizer.step(); optimizer.zero_grad(); num_tokens = 0",
     "each epoch cut in K from its start; an epoch's leftover joins the "
     "next epoch's first window, K + r micro-batches at 1/N over all their "
     "items; the run's last leftover backwarded in no step",
     "window-sum-across-epochs",
     "issue 44: torchtune 0.6.1's recipes "
     "(full_finetune_single_device.py train(): num_tokens and the "
     "gradients reset only after a step, the step at `(idx + 1) % "
     "self._gradient_accumulation_steps == 0` on the epoch's enumerate; "
     "conformance cell torchtune==0.6.1 recipe.partial); CTest "
     "PyTorch.contract.sft.window_sum",
     "window.sum-across-epochs"},
    // reduction="sum" with the mean's / K.
    {"summed-loss-divided-by-k", "a summed micro-batch loss divided by K",
     "Each micro-batch's loss is the sum of its item losses (PyTorch's "
     "reduction=\"sum\", Keras' reduction=\"sum\") and the loop divides it "
     "by K, the /K that belongs to a micro-batch mean. Every item then "
     "weighs 1/K where the large batch gives it 1/N_w, whatever the size "
     "of its micro-batch: with equal micro-batches of b items the gradient "
     "is b times the large batch's, and plain SGD trains at b times the "
     "learning rate (Adam almost hides it). no-loss-normalization weighs "
     "an item 1/b_k instead: the two give the same weights only where every "
     "b_k = K, and certify names them tied there. Divide by the window's "
     "item count.",
     " for i, (x, y) in enumerate(loader):\n"
     "-    loss = F.cross_entropy(model(x), y, reduction=\"sum\") / K\n"
     "+    loss = F.cross_entropy(model(x), y, reduction=\"sum\") / N_w\n"
     "     loss.backward()\n"
     "     if (i + 1) % K == 0:\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "every item weighs 1/K instead of 1/N_w: G = (N_w/K) * g, b times the "
     "large batch's gradient with micro-batches of b items",
     "summed-loss-divided-by-k",
     "PyTorch's and Keras' reduction=\"sum\" with the usual loss / K "
     "(examples/contract/train.py --loop summed_over_k, CTest "
     "PyTorch.contract.gpt.summed_over_k; examples/jax/train_keras.py's "
     "sum_loss case, conformance cell keras fit.sum_loss)",
     "loss-normalization.summed-loss-divided-by-k difference.device"},
};

}  // namespace

std::span<const ExplainEntry> loop_pitfalls() { return kLoopPitfalls; }

}  // namespace accumcheck::explain_catalog
