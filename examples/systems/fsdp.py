"""FSDP2 (torch.distributed.fsdp.fully_shard) with gradient accumulation,
recorded for the contract tier: 2 gloo ranks on CPU.

    fsdp.py --spawn 2 --out trace/                          # correct
    fsdp.py --spawn 2 --loop sync_every_micro_step --out trace/
    fsdp.py --spawn 2 --loop no_sync_at_boundary --out trace/
    fsdp.py --spawn 2 --loop clip_local_norm --out trace/
    accumcheck certify --contract --trace trace/

The GPT-style decoder of examples/contract/models.py, each block and the
root sharded with fully_shard over a CPU device mesh; AdamW steps on the
shards.  The correct loop turns gradient sync off
(set_requires_gradient_sync(False)) on every micro-step but the window's
last, whose backward reduce-scatters the accumulated gradient (averaged
over the ranks), and clips with the global norm (clip_grad_norm_ on the
DTensor gradients).  The loops (--loop):
  correct               as above
  sync_every_micro_step sync left on: a reduce-scatter per micro-step (same values)
  no_sync_at_boundary   sync left off at the window's last micro-step too
  clip_local_norm       each rank clips its own shard by its shard's norm
                        (p.grad.to_local().mul_(factor): ddp-clip-local-norm)
  whole_grad            each rank replaces its sharded .grad by the whole gradient
                        (p.grad = p.grad.full_tensor()) before the step: PyTorch's
                        optimizer fails on it, the recorder refuses first (exit 2)
  flat_hook             --fsdp1 only: a gradient hook that doubles the first block's
                        gradient, on its FlatParameter (under use_orig_params=True a hook
                        on an original parameter never fires: autograd sees the
                        FlatParameter), registered before the recorder
  rank_skips            each rank leaves out one batch it drew (rank 0 its last, rank 1
                        its first): the ranks' micro-batch numbers differ at every forward
                        (the ranks still agree on the forwards they calibrate)
The set-ups (--setup), the mistakes the recorder refuses (exit 2) when it
is made:
  correct               every block and the root sharded (no replica: the recorders
                        read each weight at the forward's outputs)
  replica               an older script's replica= (a plain module of the same
                        architecture): accepted, unused, a FutureWarning says so
  hsdp                  FSDP2 over a 2-D mesh (HSDP: replicated across the ranks,
                        sharded within each): placements (Replicate(), Shard(0))
  no_orig_params        --fsdp1 only: FullyShardedDataParallel without
                        use_orig_params=True (its default)
--fsdp1: FSDP1 instead, FullyShardedDataParallel(device_id=
torch.device("cpu"), use_orig_params=True) with each block wrapped
(ModuleWrapPolicy), accumulation under model.no_sync(), recorded by
ContractFSDP1Recorder (without device_id it refuses CPU: "FSDP needs a
non-CPU accelerator device, but no accelerator device is detected.").  The
same loops; its correct clip is FSDP1's own model.clip_grad_norm_ (the
whole gradient's norm), its clip_local_norm torch.nn.utils.clip_grad_norm_
on FSDP1's parameters (each rank's shard: PyTorch's FSDP1 docs say to use
the former).
--loss penalty (FSDP2): summed_loss adds a penalty on the weights (0.01 x the
squares of this rank's shard of the first block's first weight): the loss
reaches a parameter by another path than the outputs, which the FSDP
recorders cannot read; every rank's recording ends at the first backward,
the training goes on.
--mp (FSDP2): MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32) on every fully_shard.
--no-record: without the recorder; --identity PATH: without it, then with
it, in this process (each rank's trained shard must be the same bits:
identity.py).  --d, --layers: the decoder's width and depth (bench).  Each
rank prints its CPU seconds in the loop (the recorder's construction and
close() included) and its peak memory (ru_maxrss) unless --quiet
(bench/systems_bench.py)."""

import argparse
import contextlib
import functools
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contract"))
import identity  # noqa: E402
import models  # noqa: E402
from accumcheck_torch import exit_on_refusal  # noqa: E402
from accumcheck_torch.distributed import run_ranks  # noqa: E402
from accumcheck_torch.fsdp import ContractFSDP1Recorder, ContractFSDPRecorder  # noqa: E402

LOOPS = ("correct", "sync_every_micro_step", "no_sync_at_boundary", "clip_local_norm", "whole_grad",
         "flat_hook", "rank_skips")
SETUPS = ("correct", "replica", "hsdp", "no_orig_params")
CLIP = 1.0


def clip_local(params, max_norm):
    """The mistake: each rank's shard clipped by its own shard's norm."""
    local = [p.grad.to_local() for p in params if p.grad is not None]
    norm = float(torch.sqrt(sum(g.double().pow(2).sum() for g in local)))
    factor = min(1.0, max_norm / (norm + 1e-6))
    for g in local:
        g.mul_(factor)


def shard(net, ranks, a):
    """The model sharded as --setup says."""
    if a.fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return FullyShardedDataParallel(net, device_id=torch.device("cpu"),
                                        use_orig_params=a.setup != "no_orig_params",
                                        auto_wrap_policy=ModuleWrapPolicy({models.Block}))
    if a.setup == "hsdp":
        mesh = init_device_mesh("cpu", (ranks, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (ranks,))
    kw = {}
    if a.mp:
        from torch.distributed.fsdp import MixedPrecisionPolicy
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for b in net.blocks:
        fully_shard(b, mesh=mesh, **kw)
    return fully_shard(net, mesh=mesh, **kw)


def penalised(model, batch):
    """summed_loss plus a penalty on the weights (--loss penalty)."""
    w = model.blocks[0].qkv.weight  # FSDP2: a DTensor (its shard); FSDP1: this rank's shard
    w = w.to_local() if hasattr(w, "to_local") else w
    return models.gpt_summed_loss(model, batch) + 0.01 * w.pow(2).sum()


def train(rank, ranks, a):
    torch.manual_seed(0)
    net = shard(models.TinyGPT(d=a.d, layers=a.layers), ranks, a)
    # An older script's replica, made before the dropout seed: its initial
    # draws would move every dropout mask of the run (identity.py).
    replica = models.TinyGPT(d=a.d, layers=a.layers) if a.setup == "replica" and \
        not a.no_record else None
    summed = penalised if a.loss == "penalty" else models.gpt_summed_loss
    if a.loop == "flat_hook":
        # The gradient autograd hands the first block's FlatParameter, doubled.
        net.module.blocks[0]._handle.flat_param.register_hook(lambda g: g * 2)
    torch.manual_seed(1 + rank)  # each rank's own dropout masks
    data = models.gpt_data(n=a.samples)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
    c0 = time.process_time()  # bench/systems_bench.py: the loop's CPU, the recorder's included
    rec = None
    if not a.no_record:
        make = ContractFSDP1Recorder if a.fsdp1 else ContractFSDPRecorder
        kw = {} if replica is None else {"replica": replica}
        rec = make(net, opt, summed, models.gpt_items, accumulation=a.K, out=a.out,
                   items="tokens", clip=CLIP, **kw)
        loader = rec.watch(loader)
    batches = list(loader)
    if a.loop == "rank_skips":
        batches = batches[:-1] if rank == 0 else batches[1:]
    for w in range(0, len(batches), a.K):
        window = batches[w:w + a.K]
        n = torch.tensor(float(sum(models.gpt_items(b) for b in window)))
        dist.all_reduce(n)
        for i, b in enumerate(window):
            last = i + 1 == len(window)
            sync = a.loop == "sync_every_micro_step" or (last and a.loop != "no_sync_at_boundary")
            if a.fsdp1:
                ctx = contextlib.nullcontext() if sync else net.no_sync()
            else:
                net.set_requires_gradient_sync(sync)
                ctx = contextlib.nullcontext()
            with ctx:
                loss = summed(net, b) * ranks / n
                loss.backward()
        if a.fsdp1 and a.loop != "clip_local_norm":
            net.clip_grad_norm_(CLIP)  # FSDP1's own: the whole gradient's norm
        elif a.fsdp1 or a.loop != "clip_local_norm":
            # FSDP2's DTensor gradients: the whole gradient's norm; FSDP1's
            # parameters: each rank's shard's (the mistake)
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        else:
            clip_local(list(net.parameters()), CLIP)
        if a.loop == "whole_grad":
            for p in net.parameters():
                p.grad = p.grad.full_tensor()
        opt.step()
        opt.zero_grad()
    if rec is not None:
        rec.close()
    if not a.quiet:
        print("rank %d: %.3f s cpu in the loop%s, peak memory %.0f MB"
              % (rank, time.process_time() - c0, " (not recorded)" if a.no_record else "",
                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    return net


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="trace")
    ap.add_argument("--loop", choices=LOOPS, default="correct")
    ap.add_argument("--setup", choices=SETUPS, default="correct")
    ap.add_argument("--loss", choices=("summed", "penalty"), default="summed")
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--spawn", type=int, metavar="R", help="launch R gloo ranks here (else torchrun's)")
    ap.add_argument("--mp", action="store_true",
                    help="FSDP2 under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)")
    ap.add_argument("--fsdp1", action="store_true",
                    help="FSDP1 (FullyShardedDataParallel, no_sync()) instead of FSDP2")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; each rank "
                    "writes both runs' parameter digests to PATH.rank<r> (identity.py)")
    a = ap.parse_args()
    if a.fsdp1 and (a.loop == "whole_grad" or a.setup == "hsdp"):
        ap.error("--loop whole_grad and --setup hsdp are FSDP2's (DTensor gradients, a device mesh)")
    if a.fsdp1 and a.loss == "penalty":
        ap.error("--loss penalty is FSDP2's (FSDP1's shards are not the weights its forward reads)")
    if a.loop == "flat_hook" and not a.fsdp1:
        ap.error("--loop flat_hook is FSDP1's (--fsdp1)")
    if a.mp and a.fsdp1:
        ap.error("--mp is FSDP2's MixedPrecisionPolicy")
    if a.setup == "no_orig_params" and not a.fsdp1:
        ap.error("--setup no_orig_params is FSDP1's (--fsdp1)")
    run_ranks(functools.partial(identity.twice, train, a.identity) if a.identity else train,
              a, spawn=a.spawn)


if __name__ == "__main__":
    exit_on_refusal(main)
