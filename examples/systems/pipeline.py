"""A two-stage pipeline (torch.distributed.pipelining: PipelineStage with
ScheduleGPipe or Schedule1F1B) with gradient accumulation over several
schedule steps, recorded for the contract tier: 2 gloo ranks on CPU, one
stage each.

    pipeline.py --spawn 2 --schedule gpipe --out trace/    # correct
    pipeline.py --spawn 2 --schedule 1f1b --loop scale_grads --out trace/
    accumcheck certify --contract --trace trace/stage0
    accumcheck certify --contract --trace trace/stage1

An MLP (Linear-Tanh-Linear-Tanh-Linear, summed squared error) cut into
two stages (three with 3 ranks); each schedule.step splits a batch of n x b samples into n
micro-batches; the optimizer steps every K schedule steps (n x K
micro-batches a window).  Each stage has its own AdamW on its own
parameters.  The loops (--loop):
  correct      scale_grads=False, the schedule's loss_fn the summed loss / N_w
               (N_w: the window's n x K micro-batches' samples)
  scale_grads  the same loss with the schedule's default scale_grads=True: each
               schedule.step divides the stage's whole .grad by n, the
               gradient accumulated by the window's earlier steps too
  per_step_mean the loss a mean over the micro-batch (as the schedule's docs
               pair with scale_grads=True), no / K: right for K = 1 only
  no_scale     scale_grads=False and the summed loss undivided
  boundary     optimizer.step when s % K == 0 (the window one step off)
  decay_hook   correct's loss, and weight decay added to stage 0's gradient by
               a tensor hook on its parameters (g + 0.01 p) in every backward:
               n x K times a window, and no micro-batch's gradient there a
               multiple of its g_j (stage 1 is correct's)
--no-record: without the recorder (each rank prints its CPU seconds in
the loop, the recorder's construction and close() included, and its
process's peak RSS, unless --quiet: bench/systems_bench.py); --width W:
the hidden layers W wide (default 32); --identity PATH: without it, then with
it, in this process (each stage's trained parameters must be the same
bits: identity.py).  --die-after N: the last stage kills
itself (SIGKILL) at the end of its N-th backward, mid schedule step (a
stage that dies mid-run: certify refuses what is left).  --n-last M: the
last stage's schedule takes n_microbatches = M (stages that disagree: the
recorder refuses them).  --accumulation-last A: the last stage's recorder
is told accumulation = A."""

import argparse
import functools
import os
import resource
import signal
import sys
import time

import torch
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contract"))
import identity  # noqa: E402
from accumcheck_torch import exit_on_refusal  # noqa: E402
from accumcheck_torch.distributed import run_ranks  # noqa: E402
from accumcheck_torch.pipelining import ContractPipelineRecorder  # noqa: E402

LOOPS = ("correct", "scale_grads", "per_step_mean", "no_scale", "boundary", "decay_hook")
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def whole_model(width=32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, 4))


def summed_loss(model, batch):
    """The sum of the samples' squared errors (what the recorder recomputes)."""
    x, y = batch
    return ((model(x) - y) ** 2).sum()


def summed_loss_on_copy(model, batch):
    """summed_loss calling the model on a copy of the input (--summed-loss
    copy): the recorder cannot tell the call is the last stage's forward."""
    x, y = batch
    return ((model(x.clone()) - y) ** 2).sum()


def samples(batch):
    return int(batch[0].shape[0])


def train(rank, ranks, a):
    whole = whole_model(a.width)
    # Stage `rank` (2 or 3 stages): shares the whole model's parameters.
    cut = {2: [whole[0:3], whole[3:]], 3: [whole[0:2], whole[2:4], whole[4:]]}[ranks][rank]
    stage = PipelineStage(cut, rank, ranks, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(a.samples, 8, generator=g), torch.randn(a.samples, 4, generator=g))
    # Every rank draws the same batches: stage 0 feeds the inputs, the last
    # stage the targets.
    loader = DataLoader(data, batch_size=a.n * a.b)
    opt = torch.optim.AdamW(cut.parameters(), lr=1e-2)
    window = {"items": 1}

    def loss_fn(out, y):
        if a.loop == "per_step_mean":
            return ((out - y) ** 2).sum() / y.shape[0]
        if a.loop == "no_scale":
            return ((out - y) ** 2).sum()
        return ((out - y) ** 2).sum() / window["items"]

    n = a.n_last if a.n_last and rank == ranks - 1 else a.n
    schedule = SCHEDULES[a.schedule](stage, n_microbatches=n, loss_fn=loss_fn,
                                     scale_grads=a.loop in ("scale_grads", "per_step_mean"))
    if a.loop == "decay_hook" and rank == 0:
        for p in cut.parameters():
            p.register_hook(functools.partial(decay, p))
    if a.die_after and rank == ranks - 1:
        die_at_backward_end(cut, a.die_after)
    c0 = time.process_time()  # bench/systems_bench.py: the loop's CPU, the recorder's included
    rec = None
    if not a.no_record:
        acc = a.accumulation_last if a.accumulation_last and rank == ranks - 1 else a.n * a.K
        rec = ContractPipelineRecorder(stage, schedule, whole, opt,
                                       summed_loss_on_copy if a.summed_loss == "copy" else summed_loss,
                                       samples, accumulation=acc, out=a.out)
        loader = rec.watch(loader)
    batches = list(loader)
    for s, (x, y) in enumerate(batches):
        if s % a.K == 0:
            window["items"] = sum(samples(b) for b in batches[s:s + a.K])
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        at_boundary = (s % a.K == 0) if a.loop == "boundary" else ((s + 1) % a.K == 0 or s + 1 == len(batches))
        if at_boundary:
            opt.step()
            opt.zero_grad()
    if rec is not None:
        rec.close()
    if not a.quiet:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
        print("rank %d: %.3f s cpu in the loop%s, peak RSS %.0f MB"
              % (rank, time.process_time() - c0, " (not recorded)" if a.no_record else "", peak))
    return cut


def decay(p, grad):
    """Weight decay as a gradient hook (--loop decay_hook)."""
    return grad + 0.01 * p.detach()


def die_at_backward_end(module, n):
    """SIGKILL this process at the end of the n-th backward that accumulates
    into module's .grad (a callback queued from a callback: after the
    recorder's own; PipelineStage's shape inference at the first step runs
    an autograd.grad, which accumulates nothing)."""
    done = [0]
    engine = torch.autograd.Variable._execution_engine
    first = next(module.parameters())

    def after():
        done[0] += 1
        if done[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)  # dies mid-run, no cleanup

    def hook(p):
        if p is first:  # the recorder's copies carry the hook too
            engine.queue_callback(lambda: engine.queue_callback(after))
    first.register_post_accumulate_grad_hook(hook)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="trace")
    ap.add_argument("--schedule", choices=tuple(SCHEDULES), default="gpipe")
    ap.add_argument("--loop", choices=LOOPS, default="correct")
    ap.add_argument("--n", type=int, default=2, help="micro-batches per schedule step")
    ap.add_argument("--b", type=int, default=2, help="samples per micro-batch")
    ap.add_argument("--n-last", type=int, help="the last stage's n_microbatches (bad input: stages "
                    "that disagree)")
    ap.add_argument("--accumulation-last", type=int, help="the last stage's recorder told this "
                    "accumulation (bad input: stages that disagree)")
    ap.add_argument("--die-after", type=int, metavar="N",
                    help="the last stage kills itself (SIGKILL) at the end of its N-th backward")
    ap.add_argument("--summed-loss", choices=("plain", "copy"), default="plain",
                    help="copy: the summed loss given to the recorder calls the model on a copy "
                    "of the input (the weights cannot be read: certify does not judge the trace)")
    ap.add_argument("--K", type=int, default=2, help="schedule steps per optimizer step")
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--width", type=int, default=32, help="the hidden layers' width (bench/: a "
                    "larger model, the recorder's memory seen beside the model's)")
    ap.add_argument("--spawn", type=int, metavar="R", help="launch R gloo ranks here (else "
                    "torchrun's): R stages, 2 or 3")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; each rank "
                    "writes both runs' parameter digests to PATH.rank<r> (identity.py)")
    a = ap.parse_args()
    run_ranks(functools.partial(identity.twice, train, a.identity) if a.identity else train,
              a, spawn=a.spawn)


if __name__ == "__main__":
    exit_on_refusal(main)
