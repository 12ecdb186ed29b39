// `accumcheck explain`: the entries (verify/teach/explain.hpp), kept as data.
// Field reports cite /work/shared/FIELD.md (repository #issue) and the seed
// documents (docs/seeds in the shared folder) by number; properties are the
// names `accumcheck check --list` prints.
#include "verify/teach/explain.hpp"

#include <algorithm>
#include <string>

#include "sim/pitfalls.hpp"

namespace accumcheck {

namespace {

// The right loop, shared by most diffs:
//   for i, (x, y) in enumerate(loader):
//       loss = criterion(model(x), y) / K
//       loss.backward()
//       if (i + 1) % K == 0:
//           optimizer.step(); scheduler.step(); optimizer.zero_grad()
constexpr ExplainEntry kEntries[] = {
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
    // ---- lessons ----------------------------------------------------------
    {"correct", "correct accumulation equals the large batch",
     "Divide each micro-batch's summed loss by the window's item count (loss "
     "/ K for equal micro-batches), zero only after the step, step the "
     "optimizer and the scheduler once per window, clip once before the "
     "step, normalize a partial window by its own count. The oracle shows "
     "it equal to the large batch to its 50th digit; the certify scenarios "
     "are built so that every pitfall leaves this trajectory.",
     " for i, (x, y) in enumerate(loader):      # micro-batches of B / K\n"
     "-    loss = criterion(model(x), y)         # the large batch B\n"
     "+    loss = criterion(model(x), y) / K\n"
     "     loss.backward()\n"
     "-    optimizer.step(); scheduler.step(); optimizer.zero_grad()\n"
     "+    if (i + 1) % K == 0:\n"
     "+        optimizer.step(); scheduler.step(); optimizer.zero_grad()",
     "G_t = (1/N_w) sum over the window of grad l_i(theta_t): the large "
     "batch's gradient, for any optimizer and schedule (no BatchNorm, "
     "sample-keyed dropout)",
     "correct certify-mlp certify-mlp-200 certify-mean-over-k "
     "certify-mean-over-k-ce certify-adamw",
     "llm.c (zero on micro-step 0, dloss = 1/(B*T*K), += everywhere); "
     "Accelerate test_sync, transformers GA tests (loss only, |dloss| < 0.01)",
     "equivalence.oracle equivalence.device trajectory.device-smooth "
     "bitwise.accumulation-equals-large-batch.device "
     "backward.twice-is-2x.device "
     "partial.correct-weighs-1-over-n determinism.traces.device"},
    {"lr-scaling",
     "keep the learning rate: accumulation already is the large batch",
     "Seed 001 keeps the lr, seed 003 scales it by K, seed 002 by sqrt(K). "
     "Correct accumulation at the large batch's lr is the large batch, so "
     "only the first stays on its trajectory; the scaled runs are a "
     "different (larger-lr) experiment.",
     "-optimizer = SGD(model.parameters(), lr=lr * K)        # seed 003\n"
     "-optimizer = SGD(model.parameters(), lr=lr * K ** 0.5) # seed 002\n"
     "+optimizer = SGD(model.parameters(), lr=lr)            # seed 001",
     "none: equals the reference; linear and sqrt: the reference at lr*K or "
     "lr*sqrt(K), a different trajectory",
     "lr-scaling-none lr-scaling-linear lr-scaling-sqrt",
     "seeds 001 (no retuning), 002 (eta*sqrt(K)), 003 (scale by K)",
     "equivalence.oracle loss-normalization.sgd-at-k-lr"},
    {"batchnorm-micro-stats",
     "with BatchNorm, correct accumulation is not the large batch",
     "BatchNorm normalizes with each micro-batch's statistics and updates "
     "its running stats K times per step, so even a correct loop differs "
     "from the large batch, unless every micro-batch is the same multiset "
     "of samples. LayerNorm (per-sample) shows no divergence; seed 003 "
     "suggests GroupNorm for the same reason.",
     "-nn.BatchNorm1d(h)     # statistics over b, not over the window\n"
     "+nn.LayerNorm(h)       # per sample: accumulation equals the large batch",
     "running stats r <- (1-m)^K r0 + m sum_k (1-m)^(K-k) mu_k, variance "
     "with b/(b-1); the gradient uses micro-batch mean and variance",
     "batchnorm-micro-stats batchnorm-micro-stats-layernorm "
     "batchnorm-micro-stats-groupnorm batchnorm-replicated "
     "certify-batchnorm certify-layernorm certify-groupnorm",
     "seed 003 (BatchNorm vs GroupNorm); FIELD.md: BN stats updated twice "
     "under recompute (pytorch #96136)",
     "batchnorm.micro-stats-divergence batchnorm.replicated-zero-divergence "
     "batchnorm.running-stats-k-updates layernorm.correct-equals-large-batch "
     "groupnorm.correct-equals-large-batch device.batchnorm "
     "device.layernorm-dropout device.groupnorm"},
    {"dropout-sample-keyed",
     "dropout with masks keyed by sample keeps the equivalence",
     "PyTorch draws dropout masks in call order, so a micro-batched run sees "
     "other masks than the large batch. With masks keyed by (seed, epoch, "
     "sample, layer, unit) correct accumulation equals the large batch "
     "exactly; judge with the same masks, never with a loose tolerance.",
     "-mask = torch.rand_like(h) > p            # call order\n"
     "+mask = keyed_uniform(seed, epoch, sample_ids, layer) > p",
     "correct = large batch exactly, masks and all", "dropout-sample-keyed",
     "FIELD.md: dropout RNG under checkpointing (OLMo-core #828); PyTorch "
     "1.13 facts (masks in call order)",
     "dropout.sample-keyed-equals-large-batch device.layernorm-dropout"},
    {"memory-lesson", "what accumulation saves: activations, nothing else",
     "Training memory is parameters + gradients + optimizer states + "
     "activations. Accumulating K micro-batches of b instead of one batch "
     "of b*K keeps the same parameters, the same gradient buffers (they "
     "live across the whole window: accumulation needs them) and the same "
     "optimizer states; only the activations shrink, by the factor K. "
     "`accumcheck memory` prints the breakdown, checked against PyTorch's "
     "allocations.",
     " # batch B = b * K\n"
     "-for x, y in loader(batch_size=B):       # activations ~ B\n"
     "+for x, y in loader(batch_size=B // K):  # activations ~ B/K; grads stay",
     "bytes = 4P (parameters) + 4P (gradients, all window) + 8P (Adam m, v) "
     "[+ 4P fp32 master weights with mixed precision] + activations(b)",
     "memory-lesson",
     "seed 000 (accumulation saves only activation memory: right), seed 002 "
     "(gradient storage falls to 0 %: wrong), seed 004 (Adam costs "
     "parameters x 3: right for parameters + states; gradients come on top)",
     "equivalence.oracle"},
    {"mindspore-grad-accumulation-cell",
     "MindSpore's GradAccumulationCell: the mean of micro-batch means",
     "Seed 003 cites MindSpore's GradAccumulationCell, which averages the K "
     "micro-batch gradients with equal weight (each micro-batch's mean "
     "loss / K). That is the large batch only when every micro-batch has "
     "the same size (and, for tokens, the same loss-bearing count); a short "
     "last micro-batch or unequal token counts make each of their items "
     "weigh more. The scenarios accept that semantics as the trainer's "
     "contract and show where it departs from the large batch.",
     "-grads = [g / K for g in micro_batch_mean_grads]   # equal weights\n"
     "+grads = [g * b_k / N_w for g, b_k in zip(micro_batch_mean_grads, "
     "sizes)]",
     "an item of micro-batch k weighs 1/(K*b_k) (sample-mean-of-means; "
     "token-mean-of-means for tokens); equal to correct iff every b_k "
     "(T_k) is equal",
     "mindspore-grad-accumulation-cell mindspore-grad-accumulation-cell-equal "
     "mindspore-grad-accumulation-cell-short-batch "
     "mindspore-grad-accumulation-cell-tokens",
     "seed 003 (MindSpore GradAccumulationCell)",
     "loss-normalization.sample-mean-of-means token.mean-of-means-weights "
     "token.mean-of-means-equal-lengths-is-correct"},
    {"k-ramp", "K that changes during training",
     "Seed 002's cold start (`accumulation_steps = min(epoch * 2, 8)`) ramps "
     "K per epoch; its formula gives K = 0 in epoch 0, which accumcheck "
     "refuses. Correct accumulation stays 1/N_w per window whatever K is, "
     "and equals the large batch of the same windows; the schedule's "
     "horizon must count the run's own optimizer steps.",
     "-accumulation_steps = min(epoch * 2, 8)      # 0 in epoch 0\n"
     "+accumulation_steps = min((epoch + 1) * 2, 8)\n"
     "+loss = criterion(model(x), y) / accumulation_steps",
     "G_t = (1/N_w) sum over the window of grad l_i(theta_t), N_w of the "
     "epoch's own K",
     "seed-002-ramp seed-002-ramp-loop certify-ramp",
     "seed 002 (cold start); GPT-3 and Megatron-LM batch ramps",
     "ramp.correct-equals-large-batch"},
    {"ddp-token-mean-across-ranks",
     "each rank divides by its own token count, then DDP averages",
     "The data-parallel form of the Transformers accumulation bug: every "
     "rank normalizes its window's loss by the tokens it holds itself, and "
     "DDP's all-reduce then averages the R ranks. A token on a rank with "
     "few tokens weighs more than one on a busy rank; the fix counts the "
     "window's tokens over every rank (an all-reduce of the count) before "
     "the first backward.",
     " for i, batch in enumerate(loader):\n"
     "-    n = (batch.labels != -100).sum()              # this rank's tokens\n"
     "+    n = global_tokens_in_window                   # all_reduce(SUM) "
     "first\n"
     "+    n = n / world_size                            # DDP averages ranks\n"
     "     loss = F.cross_entropy(logits, y, reduction='sum') / n\n"
     "     loss.backward()",
     "a token of rank r weighs 1/(R*T_r) instead of 1/T (T_r: rank r's "
     "tokens in the window, T: all ranks'); equal to correct when every "
     "rank holds the same number of tokens",
     "ddp-token-mean-across-ranks",
     "FIELD.md: DP token mean per rank (transformers #34242, torchtitan "
     "#1842/#2206, Megatron-LM #7452: gradient 14/3 vs 4)",
     "ddp.uneven-shards inertness.ddp token.mean-of-means-weights"},
    {"ddp-uneven-shards", "per-rank sample means over unequal shards",
     "Each rank averages over its own shard and DDP averages the ranks. "
     "With DistributedSampler's padding every shard has the same size and "
     "nothing shows; with a sampler that splits without padding (order[r::R]) "
     "a rank with fewer samples gives each of them more weight, and the "
     "window is no longer the large batch's mean.",
     "-    loss = criterion(model(x), y) / K      # mean over this rank's b\n"
     "+    loss = criterion_sum(model(x), y) * world_size / N_w\n"
     "+    # N_w: the window's samples over ALL ranks, counted before backward",
     "a sample of rank r weighs 1/(R*N_{w,r}) instead of 1/N_w; equal to "
     "correct when every rank holds N_w/R samples",
     "ddp-uneven-shards",
     "FIELD.md: DistributedSampler pads each epoch by repeating samples "
     "(drop_last=False); the DP token-mean reports (Megatron-LM #7452)",
     "ddp.uneven-shards inertness.ddp"},
    {"ddp-no-sync-everywhere", "no_sync on every micro-step, the last too",
     "DDP decides in the forward whether the backward all-reduces. A loop "
     "that wraps every micro-step in no_sync() (or sets the flag on the "
     "wrong micro-step) never synchronizes: each rank steps on its own "
     "shards' gradient, and since DDP never re-broadcasts parameters nor "
     "warns, the replicas drift apart silently.",
     " for i, (x, y) in enumerate(loader):\n"
     "-    with model.no_sync():\n"
     "+    sync = (i + 1) % K == 0\n"
     "+    with (nullcontext() if sync else model.no_sync()):\n"
     "         loss = criterion(model(x), y) / K\n"
     "         loss.backward()",
     "each rank steps on (R/N_w) times its own shards' gradient; the ranks' "
     "parameters differ after the first step (certify: ranks agree fails)",
     "ddp-no-sync-everywhere",
     "FIELD.md: DDP no_sync misuse (build-nanogpt #30, ClassyVision #706, "
     "FunASR #3472); DDP never re-broadcasts parameters; ranks out of "
     "lockstep (NeMo Automodel #2468)",
     "ddp.no-sync-everywhere inertness.ddp"},
    {"ddp-sync-every-micro-step", "no no_sync at all: K all-reduces per step",
     "Without no_sync() every backward all-reduces. The values are "
     "correct's (the average of sums is the sum of averages up to "
     "rounding), but every window pays K all-reduces instead of one: the "
     "communication that accumulation was meant to save. Only the events "
     "show it.",
     " for i, (x, y) in enumerate(loader):\n"
     "-    loss = criterion(model(x), y) / K      # syncs every micro-step\n"
     "+    ctx = nullcontext() if (i + 1) % K == 0 else model.no_sync()\n"
     "+    with ctx:\n"
     "+        loss = criterion(model(x), y) / K\n"
     "     loss.backward()",
     "correct's values; K all_reduce events per optimizer step instead of 1",
     "ddp-sync-every-micro-step",
     "FIELD.md: a forward outside no_sync with the backward inside syncs "
     "every micro-step (build-nanogpt #30, ClassyVision #706)",
     "ddp.sync-every-micro-step inertness.ddp"},
    {"ddp-clip-local-norm", "gradient clipping on each rank's local shard",
     "With a sharded gradient (ZeRO, FSDP) clip_grad_norm_ on the local "
     "shard computes each shard's own norm, about 1/sqrt(R) of the total, "
     "and clips each shard by it: too little clipping overall, and the "
     "shards are scaled by different factors, which changes the gradient's "
     "direction.",
     "-torch.nn.utils.clip_grad_norm_(local_shard_params, c)\n"
     "+model.clip_grad_norm_(c)     # FSDP: the norm over every shard",
     "chunk q of ceil(P/R) gradient elements scaled by min(1, c/(|g_q| + "
     "1e-6)) instead of min(1, c/(|g| + 1e-6))",
     "ddp-clip-local-norm",
     "FIELD.md: clip norm on local shards: 1/sqrt(R) (pytorch #170862, "
     "torchtitan #766); measured on FSDP2 and FSDP1 trainers "
     "(docs/memory-systems.md, CTest "
     "PyTorch.systems.fsdp2.clip_local_norm, "
     "PyTorch.systems.fsdp1.clip_local_norm)",
     "ddp.clip-local-norm inertness.ddp"},
    {"ddp-scheduler-per-rank", "the scheduler stepped once per process",
     "A scheduler wrapped for distributed training (or called once per "
     "process on a shared counter) advances R times per optimizer step: "
     "warmup ends R times too early and the decay runs R times too fast.",
     "     optimizer.step()\n"
     "-    for _ in range(world_size): scheduler.step()   # e.g. accelerate\n"
     "+    scheduler.step()                               # once per step",
     "optimizer step t uses S(t*R) instead of S(t)", "ddp-scheduler-per-rank",
     "FIELD.md: scheduler stepped xR under DP (transformers #24088, "
     "accelerate #2926)",
     "ddp.scheduler-per-rank inertness.ddp"},
    {"low-precision-grad-buffer", "gradients accumulated in bf16",
     "The micro-batch gradients are summed in a bf16 .grad (the model's "
     "own bf16 parameters, no fp32 accumulation buffer). Each contribution "
     "is rounded to 8 significant bits and so is every running sum: once "
     "the sum is 256 times a contribution, the contribution is lost.",
     "-model = model.to(torch.bfloat16)         # .grad in bf16\n"
     "+master = [p.detach().float() for p in model.parameters()]\n"
     "+acc = [torch.zeros_like(m) for m in master]  # fp32 accumulation\n"
     "+for a, p in zip(acc, model.parameters()): a += p.grad.float()",
     "s = rnd(s + rnd(g_k)) per micro-step; |s - sum g_k| <= gamma_K(u') "
     "sum|g_k| with u = 2^-8 (bf16), 2^-11 (fp16)",
     "low-precision-grad-buffer mixed-precision-correct",
     "DeepSpeed #1800, #2768; trl #2175 (in bf16 256 + 1 = 256)",
     "precision.low-precision-grad-buffer precision.buffer-bound.device"},
    {"clip-before-unscale", "clip_grad_norm_ before scaler.unscale_()",
     "With a GradScaler the gradients hold S times their value until "
     "unscale_. Clipping before it measures S*|G| against c, so the "
     "threshold acts as c/S: with S = 65536 nearly every step is clipped "
     "to a vanishing norm.",
     "     scaler.scale(loss / K).backward()\n"
     "     if (i + 1) % K == 0:\n"
     "-        clip_grad_norm_(model.parameters(), c)\n"
     "-        scaler.unscale_(optimizer)\n"
     "+        scaler.unscale_(optimizer)\n"
     "+        clip_grad_norm_(model.parameters(), c)\n"
     "         scaler.step(optimizer); scaler.update()",
     "G' = G * min(1, c / (S |G| + 1e-6)) instead of "
     "G * min(1, c / (|G| + 1e-6))",
     "clip-before-unscale", "seed 002 (GradScaler with clipping)",
     "scaler.clip-before-unscale"},
    {"scaler-update-every-micro-step",
     "scaler.unscale_() / update() on every micro-step",
     "unscale_ divides the .grad by S; called on a micro-step that does "
     "not step, it divides the running sum, and the next unscale_ divides "
     "it again: micro-batch k of K ends up weighted S^-(K-1-k). update() "
     "per micro-step also grows the scale K times too fast.",
     "     scaler.scale(loss / K).backward()\n"
     "-    scaler.unscale_(optimizer); scaler.update()\n"
     "     if (i + 1) % K == 0:\n"
     "+        scaler.unscale_(optimizer)\n"
     "         scaler.step(optimizer)\n"
     "+        scaler.update()",
     "G = sum_k g_k S^-(K-1-k) / N (scale constant within the window)",
     "scaler-update-every-micro-step", "pytorch #36601; Transformers #23935",
     "scaler.update-every-micro-step"},
    {"skipped-step-advances-scheduler", "scheduler.step() after a skipped step",
     "scaler.step() skips optimizer.step() when unscale_ found an inf or "
     "NaN. A loop that calls scheduler.step() regardless moves the lr one "
     "step ahead of the optimizer per skip.",
     "         scaler.step(optimizer); scaler.update()\n"
     "-        scheduler.step()\n"
     "+        if not optimizer_step_was_skipped:\n"
     "+            scheduler.step()",
     "after s skips, step t uses S(t + s) instead of S(t)",
     "skipped-step-advances-scheduler mixed-precision-correct",
     "accelerate #4242",
     "scaler.skipped-step-advances-scheduler scaler.skip-leaves-state"},
    {"accumulator-rescaled", "buf = 2*buf + g at every micro-step",
     "A hand-written accumulator that doubles the running sum before each "
     "add (a momentum-like update with the wrong coefficient): micro-batch "
     "k of K weighs 2^(K-1-k). Adam hides the scale at small K; at large K "
     "2^K overflows float32 and training dies.",
     "-    acc = 2 * acc + grad\n"
     "+    acc = acc + grad",
     "G = sum_k 2^(K-1-k) g_k / N; with equal g_k, (2^K - 1)/K times "
     "correct: float32 v = G^2 overflows from K = 128, G from K = 256",
     "accumulator-rescaled", "issue 13 (rescaled accumulators)",
     "state.accumulator-rescaled"},
    {"ema-every-micro-step", "the EMA updated every micro-step",
     "The EMA of the weights (AveragedModel, an ema.update() call) sits "
     "in the micro-batch loop instead of after the step: it decays K times "
     "per optimizer step, K - 1 times towards the weights before it.",
     "     loss.backward()\n"
     "-    ema.update(model)\n"
     "     if (i + 1) % K == 0:\n"
     "         optimizer.step(); optimizer.zero_grad()\n"
     "+        ema.update(model)",
     "ema <- d ema + (1-d) theta_t (K_w - 1 times), then d ema + (1-d) "
     "theta_{t+1}; correct: the last only",
     "ema-every-micro-step mixed-precision-correct", "F5-TTS #631",
     "state.ema-every-micro-step state.ema-per-step"},
    {"optimizer-state-every-micro-step",
     "Adam's step count and decay advanced every micro-step",
     "An optimizer whose state moves on every call (keras' iterations "
     "counter, a decay applied per batch) advances t and the decoupled "
     "weight decay on micro-steps that do not step: bias corrections use "
     "t*K, the decay is applied K times per step.",
     "-    optimizer.iterations += 1; p *= 1 - lr * wd   # every batch\n"
     "     if (i + 1) % K == 0:\n"
     "         optimizer.step()   # t += 1, p *= 1 - lr * wd once",
     "t_after_step = sum of micro-steps; decay (1 - lr*wd)^K per step",
     "optimizer-state-every-micro-step", "keras #19990",
     "state.optimizer-state-every-micro-step"},
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
     "optimizer step, and the lr schedule, whose horizon is that budget, "
     "looks complete.",
     "-num_update_steps_per_epoch = max(len_dataloader // K, 1)\n"
     "+num_update_steps_per_epoch = max(math.ceil(len_dataloader / K), 1)\n"
     " max_steps = math.ceil(num_train_epochs * num_update_steps_per_epoch)",
     "steps = epochs x max(1, floor(M / K)), correct: epochs x ceil(M / K); "
     "the windows before the stop are the loop's own",
     "step-budget-drops-micro-batches",
     "transformers src/transformers/trainer.py _inner_training_loop: "
     "`num_update_steps_per_epoch = len_dataloader // "
     "args.gradient_accumulation_steps` (4.45.2 line 2095, 4.46.1 line "
     "2165, 4.47.1 line 2207) and `max_steps = math.ceil(args.num_train_"
     "epochs * num_update_steps_per_epoch)`; reported in transformers #31677 "
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
     "optimizer before the scheduler was built, stated with lr=); CTest "
     "Frameworks.*.schedule.lr_times_k",
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
     "is batch_idx + 1); issue 44; CTest "
     "Frameworks.lightning.schedule.freq2_k4.2.6.6, "
     "PyTorch.contract.gpt.step_freq2_micro",
     "scheduler.order"},
    {"ddp-lesson", "data parallelism: R ranks x K x b is the batch",
     "Correct accumulation under DDP (no_sync on every micro-step but the "
     "window's last, each rank weighting its items R/N_w with N_w counted "
     "over all ranks, DDP's average at the all-reduce) equals one "
     "process's large batch over the same windows, padding duplicates "
     "included. Seed 003's server case (240 ranks x micro-batch 10 against "
     "a target batch of 3072) gives K = 1.28, which must be rounded: "
     "accumulation stays exact at K = 1 or 2, but the batch becomes 25 or "
     "50 instead of 32 (scaled down), no K reaches the target's trajectory, "
     "and scaling the lr by K moves further from it.",
     "-K = round(target_batch / (world_size * b))    # 1.28 -> 1 or 2\n"
     "-lr = lr * K                                   # seed 003's advice\n"
     "+K = target_batch // (world_size * b)          # choose b, R so it "
     "divides\n"
     "+assert world_size * b * K == target_batch",
     "G_t = (1/N_w) sum over every rank's shards in the window of grad "
     "l_i(theta_t); the effective batch is R*K*b",
     "ddp-correct certify-ddp certify-ddp-2 certify-ddp-uneven seed-003-target "
     "seed-003-k1 seed-003-k2 seed-003-k2-linear",
     "seed 003 (effective batch 3072 on 30 nodes x 8 GPUs, linear lr "
     "scaling); FIELD.md: DistributedSampler padding duplicates, DDP's "
     "1/world_size reduction; TTrace arXiv 2506.09280 (distributed vs "
     "single-device reference)",
     "ddp.gradient-outside-trainer ddp.repartition.oracle "
     "ddp.repartition.device"},
    {"deepspeed-lesson",
     "DeepSpeed divides by K and decides the boundary itself",
     "deepspeed.initialize(config={'gradient_accumulation_steps': K, ...}) "
     "owns the accumulation: engine.backward(loss) divides the loss by K, "
     "engine.step() is called on every micro-batch and steps the optimizer "
     "only at the engine's own boundary (its micro-step counter), and the "
     "ranks' average is taken inside the engine (ZeRO 1/2: reduce-scatter "
     "into each rank's partition, ZeRO-Offload: the partition's optimizer on "
     "the CPU). With equal micro-batches that is correct accumulation over "
     "R*K*b samples. The loop of a plain PyTorch trainer breaks it twice: "
     "loss / K on top of the engine's /K leaves every gradient 1/K too small "
     "(each micro-batch weighs 1/(K*N_w), no pitfall of the catalog), and "
     "calling engine.step() only every K-th micro-batch makes the engine "
     "count one micro-step per K batches: it steps once every K*K batches "
     "(measured: under ZeRO 0 the step holds all K*K micro-batches, under "
     "ZeRO 2 only the last, as seed 002's loop) (accumcheck certify --contract "
     "reports both, measured, in "
     "docs/memory-systems.md). Under bf16 with data_types.grad_accum_dtype "
     "fp32 (ZeRO 1/2; ZeRO 0 refuses the mix) each bf16 micro-batch "
     "gradient adds into a float32 buffer, but communication_data_type "
     "defaults to bf16 and rounds the float32 sum before the step: set it "
     "to fp32 (certify --contract PASSes that, each weight read to the bf16 "
     "model's resolution).",
     " for batch in loader:\n"
     "-    loss = model_engine(batch) / K       # DeepSpeed divides again\n"
     "+    loss = model_engine(batch)           # the micro-batch's mean\n"
     "     model_engine.backward(loss)          # loss / K inside\n"
     "-    if (i + 1) % K == 0:\n"
     "-        model_engine.step()              # the engine counts calls\n"
     "+    model_engine.step()                  # every micro-batch",
     "G_t = (1/N_w) sum over every rank's micro-batches of the window of "
     "grad l_i(theta_t), N_w = R*K*b (equal micro-batches); with loss / K "
     "twice: G_t / K; with step() every K-th batch: one step per K*K "
     "micro-batches",
     "certify-ddp-2",
     "DeepSpeed #1107 (K declared twice), #1800 and #2768 (bf16 "
     "accumulation buffers), #2790 (a K x GPUs x ZeRO x dtype matrix asked "
     "for); seed 002 (ZeRO-Offload case study)",
     "ddp.gradient-outside-trainer ddp.repartition.oracle"},
    // The memory systems (docs/memory-systems.md): their accumulation
    // rules, measured on real trainers by the contract tier (CTest
    // PyTorch.systems.*).
    {"fsdp-lesson", "FSDP2: sync off but at the window's last micro-step",
     "FSDP2 (fully_shard) accumulates like DDP: each rank keeps the whole "
     "local gradient on the unsharded parameters while "
     "set_requires_gradient_sync(False); the window's last backward, with "
     "sync on, reduce-scatters it (averaged over the ranks) into the "
     "sharded .grad the optimizer steps. Sync left on every micro-step "
     "changes no weight, only the reduce-scatters (K per step); sync left "
     "off at the last micro-step too leaves .grad None: the step skips "
     "every micro-batch. Clip by the whole gradient's norm: "
     "clip_grad_norm_ on FSDP2's DTensor gradients, FSDP1's own "
     "model.clip_grad_norm_; a clip by each rank's shard's norm (by hand "
     "on p.grad.to_local(), or torch.nn.utils.clip_grad_norm_ on FSDP1's "
     "sharded parameters) is ddp-clip-local-norm, which certify names from "
     "each rank's factor. FSDP1 "
     "(FullyShardedDataParallel, on CPU with device_id=torch.device(\"cpu\") "
     "and use_orig_params=True) accumulates under model.no_sync() on every "
     "micro-step but the window's last; no_sync() at the last micro-step "
     "too leaves the gradients unsharded, and the step fails on them (a "
     "size mismatch).",
     " for i, batch in enumerate(window):\n"
     "-    model.set_requires_gradient_sync(False)\n"
     "+    model.set_requires_gradient_sync(i == len(window) - 1)\n"
     "     (summed_loss(model, batch) * R / N_w).backward()\n"
     "-clip_grad_norm_([p.grad.to_local() ...], 1.0)   # a shard's norm\n"
     "+clip_grad_norm_(model.parameters(), 1.0)       # the global norm",
     "G_t = (1/R) sum_r of rank r's local window gradient, as DDP's "
     "all-reduce; the shard of it on each rank",
     "ddp-correct ddp-sync-every-micro-step ddp-clip-local-norm",
     "issue 34; docs/memory-systems.md (CTest PyTorch.systems.fsdp2.*, "
     "PyTorch.systems.fsdp1.*)",
     "ddp.gradient-outside-trainer"},
    {"pipeline-lesson",
     "pipeline schedules: scale_grads=False when accumulating over steps",
     "A torch.distributed.pipelining schedule (ScheduleGPipe, "
     "Schedule1F1B) splits each batch into n micro-batches and runs their "
     "backward passes itself; with its default scale_grads=True it then "
     "divides the stage's whole .grad by n, the gradient that earlier "
     "schedule steps of the same window accumulated included: over K "
     "steps the first step's micro-batches weigh 1/n^K. Accumulating over "
     "K schedule steps, pass scale_grads=False and let the loss_fn divide "
     "the summed loss by the window's n*K micro-batches' items.",
     "-schedule = ScheduleGPipe(stage, n, loss_fn=mean_loss)\n"
     "+schedule = ScheduleGPipe(stage, n, loss_fn=lambda out, y: "
     "summed(out, y) / N_w,\n"
     "+                         scale_grads=False)\n"
     " for s, (x, y) in enumerate(loader):\n"
     "     schedule.step(x) if first_stage else schedule.step(target=y)\n"
     "     if (s + 1) % K == 0:\n"
     "         optimizer.step(); optimizer.zero_grad()",
     "each micro-batch of the window weighs 1/N_w on every stage's "
     "parameters; scale_grads=True over K steps: micro-batches of step k "
     "weigh (1/N_w)/n^(K-k) times the loss_fn's own scale",
     "",
     "issue 34; seed 003 (GPipe micro-batching); docs/memory-systems.md "
     "(CTest PyTorch.systems.pipeline.*)",
     "equivalence.oracle"},
    {"checkpointing-lesson",
     "activation checkpointing: recompute with the forward's RNG",
     "torch.utils.checkpoint runs a block's forward again in the backward. "
     "With preserve_rng_state=True (the default) the recomputation replays "
     "the forward's CPU RNG state, so dropout draws the same masks and the "
     "gradient is the forward's: accumulation is unchanged. With "
     "preserve_rng_state=False the backward draws fresh masks: the gradient "
     "is of no single mask (the forward used one, the backward another). "
     "Under DDP, reentrant checkpointing with no_sync works without "
     "static_graph; static_graph=True with no_sync does not (an internal "
     "assert in the reducer, torch #143580). Reentrant checkpointing of a "
     "block twice, or with find_unused_parameters=True, raises DDP's "
     "\"Expected to mark a variable ready only once\" at the window's "
     "first synchronising backward (the no_sync micro-steps before it "
     "train): checkpoint with use_reentrant=False.",
     "-x = checkpoint(block, x, use_reentrant=False, "
     "preserve_rng_state=False)\n"
     "+x = checkpoint(block, x, use_reentrant=False)   # preserve_rng_state="
     "True",
     "g_j with checkpointing = g_j without it (same masks); "
     "preserve_rng_state=False: the backward's masks are not the forward's",
     "dropout-sample-keyed",
     "issue 34; seed 004 (activation checkpointing); FIELD.md: dropout RNG "
     "under checkpointing (OLMo-core #828); docs/memory-systems.md (CTest "
     "PyTorch.systems.checkpointing.*)",
     "dropout.sample-keyed-equals-large-batch"},
};

}  // namespace

std::span<const ExplainEntry> explain_entries() { return kEntries; }

const ExplainEntry* find_explain(std::string_view id) {
  for (const ExplainEntry& e : kEntries)
    if (e.id == id) return &e;
  for (const ExplainEntry& e : kEntries) {
    std::string_view s = e.scenarios;
    while (!s.empty()) {
      const size_t sp = s.find(' ');
      if (s.substr(0, sp) == id) return &e;
      if (sp == std::string_view::npos) break;
      s.remove_prefix(sp + 1);
    }
  }
  // A lesson by its subject alone: `explain fsdp` is fsdp-lesson.
  const std::string lesson = std::string(id) + "-lesson";
  for (const ExplainEntry& e : kEntries)
    if (e.id == lesson) return &e;
  return nullptr;
}

std::string explain_text(const ExplainEntry& e) {
  std::string o;
  o.append(e.id).append(": ").append(e.title).append("\n\n");
  o.append(e.story).append("\n\nThe loop, wrong (-) and right (+):\n\n");
  std::string_view d = e.diff;
  while (!d.empty()) {
    const size_t nl = d.find('\n');
    o.append("    ").append(d.substr(0, nl)).append("\n");
    if (nl == std::string_view::npos) break;
    d.remove_prefix(nl + 1);
  }
  o.append("\nWhat the oracle predicts: ").append(e.formula).append("\n");
  if (const auto p = pitfall_from_id(e.id); p && pitfall_performance_only(*p))
    o.append(
        "Performance only: the values are those of the loop without it; "
        "certify PASSes such a trace (both tiers) with a performance "
        "finding naming it and what it costs\n");
  o.append("Run: ");
  std::string_view s = e.scenarios;
  bool first = true;
  while (!s.empty()) {
    const size_t sp = s.find(' ');
    o.append(first ? "" : ", ")
        .append("accumcheck run scenarios/")
        .append(s.substr(0, sp))
        .append(".toml");
    first = false;
    if (sp == std::string_view::npos) break;
    s.remove_prefix(sp + 1);
  }
  o.append("\nField reports: ").append(e.field).append("\n");
  o.append("Guarded by: ").append(e.properties).append("\n");
  return o;
}

std::vector<const ExplainEntry*> find_explain_parts(std::string_view id,
                                                    std::string& unknown) {
  const auto trim = [](std::string_view v) {
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    return v;
  };
  std::vector<const ExplainEntry*> out;
  if (const ExplainEntry* e = find_explain(trim(id))) return {e};
  if (id.find('+') == std::string_view::npos) {
    unknown = std::string(trim(id));
    return {};
  }
  while (true) {
    const size_t plus = id.find('+');
    const std::string_view part = trim(id.substr(0, plus));
    const ExplainEntry* e = part.empty() ? nullptr : find_explain(part);
    if (!e) {
      unknown = std::string(part);
      return {};
    }
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    if (plus == std::string_view::npos) break;
    id.remove_prefix(plus + 1);
  }
  return out;
}

std::string explain_parts_text(const std::vector<const ExplainEntry*>& parts) {
  if (parts.size() == 1) return explain_text(*parts.front());
  std::string o;
  std::string names;
  for (const ExplainEntry* e : parts)
    names.append(names.empty() ? "" : "+").append(e->id);
  o.append(names).append(": ").append(std::to_string(parts.size()));
  o.append(
      " pitfalls at once. certify ranks each combination as one candidate: "
      "the one trainer loop with every one of these mistakes, so a trace that "
      "matches it makes them all; fix each (below, in order).\n");
  for (size_t i = 0; i < parts.size(); ++i)
    o.append("\n[" + std::to_string(i + 1) + " of " +
             std::to_string(parts.size()) + "] ")
        .append(explain_text(*parts[i]));
  return o;
}

}  // namespace accumcheck
