"""DDP trainers of the contract tier's models (gloo, CPU), the way they are
usually written: DistributedSampler + DataLoader, DistributedDataParallel
around the GPT-style decoder (or the MLP-free CNN) of models.py, and
`with model.no_sync()` on every micro-step of the window but the last.
Each rank records its part with ContractDistributedRecorder; rank 0
writes the merged contract trace.

    python3 train_ddp.py --out T --loop correct --spawn 2
    torchrun --standalone --nproc_per_node 2 --redirects 9:1 --tee 9:1 \\
        train_ddp.py --out T --loop correct
    accumcheck certify --contract --trace T

(`--redirects 9:1 --tee 9:1`: Debian's torch 1.13 torchrun fails on
Python 3.11 with its default "0"; a map naming no local rank is the same
setting.)

Loops (--loop):
  correct                 the window's item count N_w all-reduced over the
                          ranks before the first backward, loss = summed
                          loss * R / N_w (DDP averages over R), no_sync on
                          every micro-step but the window's last
  local_mean              each rank divides by its own window's item count
                          (never all-reduced), then DDP averages the ranks'
                          means: ddp-token-mean-across-ranks (token losses)
  no_sync_everywhere      `with model.no_sync()` on every micro-step: the
                          ranks step on their own gradients
  sync_every_micro_step   no no_sync at all: an all-reduce per micro-step
                          (the same gradient, K times the communication)
  scheduler_per_rank      scheduler.step() R times per optimizer step
                          (declared schedule: linear warmup 2, total 12)
  average_gradients       no DDP: the plain module, and the torch.distributed
                          tutorial's average_gradients after the window's
                          last backward (all_reduce(p.grad, SUM), then
                          p.grad /= world_size), the correct loss
  average_gradients_no_div  the same without the / world_size: R times the
                          averaged gradient
  late_sync_flag          build-nanogpt's loop: no no_sync, but
                          `model.require_backward_grad_sync = (micro_step
                          == K - 1)` set after the forward (DDP read the
                          flag in it): the all-reduce runs at the window's
                          first micro-step, not its last
  clip_then_average       the plain module, each rank's window accumulated
                          locally, clip_grad_norm_(--clip) on each rank's
                          LOCAL gradient, then the tutorial's
                          average_gradients: each rank's gradient clipped
                          by its own norm before the average
                          (ddp-clip-before-all-reduce)
--clip C: clip_grad_norm_(C) on each rank before optimizer.step() (after
average_gradients: on the averaged gradient, the same on every rank),
declared to the recorder.
--die-after N: the last rank kills itself (SIGKILL) after its N-th
backward, mid-run: the other ranks fail in their next collective, and the
folder holds the ranks' markers, no trace (certify refuses it: exit 2,
naming the rank, its marker and how far it got).
--no-record: the same run without the recorder; --identity PATH: without
it, then with it, in this process (each rank's trained parameters must be
the same bits: identity.py).
"""
import argparse
import contextlib
import functools
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


import identity
import models
from models import warmup_linear
from accumcheck_torch import exit_on_refusal
from accumcheck_torch.distributed import ContractDistributedRecorder, run_ranks

LOOPS = ("correct", "local_mean", "no_sync_everywhere", "sync_every_micro_step",
         "scheduler_per_rank", "average_gradients", "average_gradients_no_div",
         "late_sync_flag", "clip_then_average")


def average_gradients(model, divide=True):
    """The torch.distributed tutorial's gradient averaging, by hand."""
    size = float(dist.get_world_size())
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            if divide:
                p.grad /= size


def train(rank, ranks, a):
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's)
    torch.set_num_threads(1)
    if a.model == "gpt":
        net, data = models.TinyGPT(), models.gpt_data(n=a.samples)
        summed, items, kind = models.gpt_summed_loss, models.gpt_items, "tokens"
    else:
        net, data = models.TinyCNN(), models.cnn_data(n=a.samples)
        summed, items, kind = models.cnn_summed_loss, models.cnn_items, "samples"
    torch.manual_seed(1 + rank)  # each rank's own dropout draws
    # gloo broadcasts no bool tensors: the causal masks (constants, the
    # same on every rank) stay out of DDP's start-up broadcast.
    DDP._set_params_and_buffers_to_ignore_for_model(
        net, [n for n, b in net.named_buffers() if b.dtype == torch.bool])
    by_hand = a.loop.startswith("average_gradients") or a.loop == "clip_then_average"
    model = net if by_hand else DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler, schedule = None, None
    if a.loop == "scheduler_per_rank" or a.schedule:
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear(2, 12))
        schedule = {"kind": "linear", "warmup": 2, "total": 12}
    rec = None if a.no_record else ContractDistributedRecorder(
        model, opt, summed, items, accumulation=a.K, out=a.out, items=kind, lr=1e-3,
        schedule=schedule, clip=a.clip)
    watch = rec.watch if rec is not None else (lambda loader: loader)
    R, K = dist.get_world_size(), a.K
    backward = 0
    sampler = DistributedSampler(data, shuffle=True, seed=1234)
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        batches = list(watch(DataLoader(data, batch_size=a.micro_batch, sampler=sampler)))
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n = torch.tensor(float(sum(items(b) for b in window)), dtype=torch.float64)
            if a.loop != "local_mean":
                dist.all_reduce(n)  # N_w over every rank, before the first backward
            for i, b in enumerate(window):
                last = i + 1 == len(window)
                if by_hand or a.loop == "late_sync_flag":
                    sync = contextlib.nullcontext()
                elif a.loop == "no_sync_everywhere" or not (last or a.loop == "sync_every_micro_step"):
                    sync = model.no_sync()
                else:
                    sync = contextlib.nullcontext()
                with sync:
                    scale = 1.0 if a.loop == "local_mean" else float(R)
                    loss = summed(model, b) * scale / n.item()
                    if a.loop == "late_sync_flag":
                        model.require_backward_grad_sync = last  # after the forward
                    loss.backward()
                backward += 1
                if a.die_after is not None and rank == R - 1 and backward == a.die_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # dies mid-run, no cleanup
            if a.clip and a.loop == "clip_then_average":
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)  # the local gradient
            if by_hand:
                average_gradients(model, divide=a.loop != "average_gradients_no_div")
            if a.clip and a.loop != "clip_then_average":
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            for _ in range(R if a.loop == "scheduler_per_rank" else (1 if scheduler else 0)):
                scheduler.step()
            opt.zero_grad()
    if rec is not None:
        rec.close()
    return net


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--loop", choices=LOOPS, default="correct")
    ap.add_argument("--model", choices=("gpt", "cnn"), default="gpt")
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--samples", type=int, default=44)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--schedule", action="store_true",
                    help="a LambdaLR warmup-linear schedule (warmup 2, total 12), declared")
    ap.add_argument("--clip", type=float, default=None,
                    help="clip_grad_norm_(max_norm) before each step, declared")
    ap.add_argument("--die-after", type=int, metavar="N",
                    help="the last rank kills itself (SIGKILL) after its N-th backward")
    ap.add_argument("--quiet", action="store_true", help="(prints nothing anyway)")
    ap.add_argument("--no-record", action="store_true", help="the same run without the recorder")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; each rank "
                    "writes both runs' parameter digests to PATH.rank<r> (identity.py)")
    ap.add_argument("--spawn", type=int, metavar="R",
                    help="start R ranks with torch.multiprocessing.spawn (not torchrun)")
    a = ap.parse_args()
    run = functools.partial(identity.twice, train, a.identity) if a.identity else train
    run_ranks(run, a, a.spawn)  # torchrun's environment, or --spawn R


if __name__ == "__main__":
    exit_on_refusal(main)
