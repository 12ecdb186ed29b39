// `accumcheck explain`'s entries (verify/teach/explain_catalog.hpp): the
// lessons, what correct accumulation is and what it does to a model's
// layers and memory (loop_lessons), then the distributed and memory
// systems (system_lessons): DDP, DeepSpeed, FSDP, pipelines,
// checkpointing.
#include <span>

#include "verify/teach/explain_catalog.hpp"

namespace accumcheck::explain_catalog {

namespace {

constexpr ExplainEntry kLoopLessons[] = {
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
};

constexpr ExplainEntry kSystemLessons[] = {
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

std::span<const ExplainEntry> loop_lessons() { return kLoopLessons; }
std::span<const ExplainEntry> system_lessons() { return kSystemLessons; }

}  // namespace accumcheck::explain_catalog
