"""Activation checkpointing (torch.utils.checkpoint) with dropout and
gradient accumulation, recorded for the contract tier.

    checkpointing.py --reentrant --out trace/          # use_reentrant=True
    checkpointing.py --out trace/                      # use_reentrant=False
    checkpointing.py --no-preserve-rng --out trace/    # preserve_rng_state=False: the mistake
    checkpointing.py --ddp --spawn 2 --out trace/      # under DDP with no_sync (2 gloo ranks)
    accumcheck certify --contract --trace trace/

The GPT-style decoder of examples/contract/models.py (dropout 0.1) with
each block checkpointed: its forward runs without keeping activations and
runs again in the backward.  The loop is the Transformers one (each
window's token count first, the summed loss divided by it); --no-record
runs it without the recorder, --identity PATH without it and then with
it (the trained parameters must be the same bits: identity.py); each rank
prints its CPU seconds in the loop (the recorder's construction and
close() included) unless --quiet (bench/systems_bench.py)."""

import argparse
import functools
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contract"))
import identity  # noqa: E402
import models  # noqa: E402
from accumcheck_torch import ContractRecorder, exit_on_refusal  # noqa: E402
from accumcheck_torch.distributed import ContractDistributedRecorder, run_ranks  # noqa: E402


class CheckpointedGPT(models.TinyGPT):
    """TinyGPT whose blocks run under torch.utils.checkpoint."""

    def __init__(self, reentrant, preserve_rng, twice=False, **kw):
        super().__init__(**kw)
        self.ckpt = functools.partial(checkpoint, use_reentrant=reentrant,
                                      preserve_rng_state=preserve_rng)
        self.twice = twice

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T)))
        for i, b in enumerate(self.blocks):
            x = self.ckpt(b, x)
            if self.twice and i == 0:
                x = self.ckpt(b, x)  # the same block again, under a checkpoint of its own
        return self.ln(x) @ self.tok.weight.t()


def train(rank, ranks, a):
    torch.manual_seed(0)
    net = CheckpointedGPT(a.reentrant, not a.no_preserve_rng, twice=a.checkpoint_twice)
    torch.manual_seed(1 + rank)  # each rank's own dropout masks
    data = models.gpt_data(n=a.samples)
    if ranks > 1:
        model = DDP(net, static_graph=a.static_graph, find_unused_parameters=a.find_unused)
        sampler = DistributedSampler(data, shuffle=False)
    else:
        model, sampler = net, None
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    c0 = time.process_time()  # bench/systems_bench.py: the loop's CPU, the recorder's included
    rec = None
    if not a.no_record:
        cls = ContractDistributedRecorder if ranks > 1 else ContractRecorder
        rec = cls(model, opt, models.gpt_summed_loss, models.gpt_items, accumulation=a.K,
                  out=a.out, items="tokens")
        loader = rec.watch(loader)
    batches = list(loader)
    for w in range(0, len(batches), a.K):
        window = batches[w:w + a.K]
        n = torch.tensor(float(sum(models.gpt_items(b) for b in window)))
        if ranks > 1:
            dist.all_reduce(n)
        for i, b in enumerate(window):
            last = i + 1 == len(window)
            ctx = model.no_sync() if ranks > 1 and not last else _nothing()
            with ctx:
                loss = models.gpt_summed_loss(model, b) * ranks / n
                loss.backward()
        opt.step()
        opt.zero_grad()
    if rec is not None:
        rec.close()
    if not a.quiet:
        print("rank %d: %.3f s cpu in the loop%s" % (rank, time.process_time() - c0,
                                                    " (not recorded)" if a.no_record else ""))
    return net


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *e):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="trace")
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--reentrant", action="store_true", help="use_reentrant=True")
    ap.add_argument("--no-preserve-rng", action="store_true", help="preserve_rng_state=False")
    ap.add_argument("--ddp", action="store_true", help="DDP with no_sync (run with --spawn R or torchrun)")
    ap.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True)")
    ap.add_argument("--find-unused", action="store_true", help="DDP(find_unused_parameters=True)")
    ap.add_argument("--checkpoint-twice", action="store_true",
                    help="the first block run twice, each under its own checkpoint")
    ap.add_argument("--spawn", type=int, metavar="R", help="launch R gloo ranks here")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; each rank "
                    "writes both runs' parameter digests to PATH.rank<r> (identity.py)")
    a = ap.parse_args()
    run = functools.partial(identity.twice, train, a.identity) if a.identity else train
    if a.ddp:
        run_ranks(run, a, spawn=a.spawn)
    else:
        run(0, 1, a)


if __name__ == "__main__":
    exit_on_refusal(main)
