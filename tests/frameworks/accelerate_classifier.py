"""Accelerate, a classifier (an MLP, the batch's mean cross-entropy),
Accelerator(gradient_accumulation_steps=4), micro-batches of 4, 2 epochs,
the everyday loop:

    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

accelerator.backward divides each micro-batch's loss by K.  With full
windows and equal batches that is 1/N_w for every sample: a framework with
exact large-batch equivalence, and accumcheck, say PASS.  At the end of the
loader Accelerate syncs and steps the short window (gradient_state's
end_of_dataloader), still dividing by K: its samples weigh half of 1/N_w
(partial-cycle-scale-by-k).

Variants:
  full     48 samples (3 full windows per epoch), SGD without momentum: PASS
  partial  40 samples (the last window of each epoch 2 micro-batches): partial-cycle-scale-by-k
  accept   as partial, record(accept=["partial-cycle-scale-by-k"]): PASS, "accepted: ..."
  clip     48 samples, AdamW, accelerator.clip_grad_norm_(..., 0.5) declared: PASS
  sched    48 samples, SGD, a prepared LambdaLR linear warmup, declared: PASS
  sched_2ranks  (or --ranks 2) 64 samples, 2 gloo ranks, 2 full windows per rank and
           epoch; Accelerate's scheduler wrapper steps the scheduler once per
           process at each optimizer step unless split_batches (#2926), so the
           schedule runs R times too fast: ddp-scheduler-per-rank)
  div_k    48 samples, SGD, the user divides the loss by K inside accumulate()
           (the plain PyTorch recipe) and accelerator.backward divides it by K
           again: every sample weighs 1/(K*N_w): loss-divided-by-k-twice
  div_k_partial  as div_k on 40 samples: the short last window is divided by
           K twice too, each of its samples weighs 1/(K*K*b):
           loss-divided-by-k-twice+partial-cycle-scale-by-k
  clip_local_2ranks  64 samples, 2 gloo ranks, SGD, clip 0.1 declared; the
           loop averages the gradients by hand: every micro-batch under
           accelerator.no_sync(model), accelerator.backward, and at the
           window's end torch's clip_grad_norm_ on each rank's LOCAL
           gradient, then all_reduce(SUM) / R and the step: each rank's
           share clipped by its own norm: ddp-clip-before-all-reduce
  sync_each  48 samples, SGD, Accelerator(gradient_accumulation_plugin=
           GradientAccumulationPlugin(num_steps=K, sync_each_batch=True)), one
           process: sync_each_batch asks DDP to all-reduce every micro-batch,
           which changes no value (PASS).  0.28.0 to 0.30.1 implemented it by
           setting sync_gradients every micro-batch, which also makes
           AcceleratedOptimizer step and zero the gradient every micro-batch
           (accelerate #2531, fixed by #2790 in 0.31.0): each micro-batch is
           stepped alone on its loss / K.  Before 0.28.0 the plugin has no
           sync_each_batch: the script fails (TypeError) before training."""

import os
import sys

import torch
import torch.nn.functional as F

import _tiny

VARIANTS = ["full", "partial", "accept", "clip", "sched", "sched_2ranks", "div_k", "div_k_partial",
            "clip_local_2ranks", "sync_each"]
K, EPOCHS, BATCH, CLIP = 4, 2, 4, 0.5
LOCAL_CLIP = 0.1
WARMUP = 2


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from accelerate import Accelerator
    from accumcheck_torch.integrations.accelerate import record

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if a.variant == "sync_each":
        from accelerate.utils import GradientAccumulationPlugin

        accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=K, sync_each_batch=True))
    else:
        accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = _tiny.MLP()
    ranks = int(os.environ.get("WORLD_SIZE", 1))
    n = 40 if a.variant in ("partial", "accept", "div_k_partial") else 64 if ranks > 1 else 48
    # The schedule's horizon: the optimizer steps of the run.
    micro = -(-(-(-n // ranks)) // BATCH)  # micro-batches per rank and epoch
    total = EPOCHS * -(-micro // K)
    loader = torch.utils.data.DataLoader(_tiny.classifier_data(n=n), batch_size=BATCH, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    if a.variant == "clip":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = (torch.optim.lr_scheduler.LambdaLR(optimizer, _tiny.warmup_linear(WARMUP, total))
                 if a.variant.startswith("sched") else None)
    if scheduler is not None:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rec = None
    if not a.no_record:
        rec = record(accelerator, model, optimizer, loader, scheduler, out=a.out,
                     clip=(CLIP if a.variant == "clip" else
                           LOCAL_CLIP if a.variant == "clip_local_2ranks" else None),
                     schedule="linear" if scheduler is not None else None, warmup=WARMUP,
                     epochs=EPOCHS,
                     accept=["partial-cycle-scale-by-k"] if a.variant == "accept" else ())
    model.train()
    if a.variant == "clip_local_2ranks":
        local_clip_loop(accelerator, model, optimizer, loader)
    for _ in range(0 if a.variant == "clip_local_2ranks" else EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                if a.variant.startswith("div_k"):
                    loss = loss / K  # backward divides by K again
                accelerator.backward(loss)
                if a.variant == "clip" and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), CLIP)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                optimizer.zero_grad()
    if rec is not None:
        rec.close()
    _tiny.digested(a, accelerator.unwrap_model(model), accelerator.process_index,
                   accelerator.num_processes)
    return 0


def local_clip_loop(accelerator, model, optimizer, loader):
    """The window under no_sync, a clip on each rank's local gradient,
    then the ranks' average by hand (the torch.distributed tutorial's
    average_gradients) and the step."""
    import torch.distributed as dist

    R = accelerator.num_processes
    for _ in range(EPOCHS):
        for i, (x, y) in enumerate(loader):
            with accelerator.no_sync(model):
                accelerator.backward(F.cross_entropy(model(x), y))  # divided by K
            if (i + 1) % K == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), LOCAL_CLIP)  # local
                for p in model.parameters():
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= R
                optimizer.step()
                optimizer.zero_grad()


if __name__ == "__main__":
    a = _tiny.variant_args(VARIANTS)
    sys.exit(_tiny.spawn(main, sys.argv[1:], 2 if a.variant.endswith("2ranks") else a.ranks))
