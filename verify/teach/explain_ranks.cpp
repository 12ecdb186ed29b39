// `accumcheck explain`'s entries (verify/teach/explain_catalog.hpp): the
// pitfalls of data parallelism (DDP's ranks), of loss scaling and low
// precision, and of state updated per micro-step (EMA, optimizer state).
#include <span>

#include "verify/teach/explain_catalog.hpp"

namespace accumcheck::explain_catalog {

namespace {

constexpr ExplainEntry kRankAndStatePitfalls[] = {
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
};

}  // namespace

std::span<const ExplainEntry> rank_and_state_pitfalls() {
  return kRankAndStatePitfalls;
}

}  // namespace accumcheck::explain_catalog
