"""DDP trainers on an accumcheck bundle (gloo, CPU), the way they are
usually written: an own nn.Module, DistributedSampler + DataLoader, the
DistributedDataParallel wrapper, `with model.no_sync()` on the window's
micro-steps but the last.  One rank per process; each rank records its
part with DistributedRecorder and rank 0 writes the merged trace.

    torchrun --standalone --nproc_per_node R --redirects 9:1 --tee 9:1 \\
        train_ddp.py --bundle B --out T --loop correct
    python3 train_ddp.py --bundle B --out T --loop correct --spawn R

(`--redirects 9:1 --tee 9:1`: Debian's torch 1.13 torchrun fails on
Python 3.11 with its default "0"; a map naming no local rank is the same
setting.)

Loops (--loop):
  correct                 N_w counted over all ranks before the first
                          backward (one all_reduce of the item count), the
                          loss sum * R / N_w (DDP averages over R), no_sync
                          on every micro-step but the window's last
  no_sync_everywhere      `with model.no_sync()` on every micro-step: no
                          gradient is ever all-reduced
  sync_every_micro_step   no no_sync at all: an all-reduce per micro-step
  local_mean              each rank's own window mean (its own item count,
                          never gathered): ddp-token-mean-across-ranks on a
                          token scenario, ddp-uneven-shards on unequal shards
  scheduler_per_rank      scheduler.step() once per process per optimizer
                          step (what an accelerate-style wrapper does)
  clip_local_norm         ZeRO-style sharding by hand: rank q clips its
                          chunk of the flat gradient by that chunk's own norm,
                          then the clipped chunks are all-gathered
  clip_main_only          clip_grad_norm_ under `if rank == 0` (the
                          "main process only" guard put around the wrong
                          line): rank 0 clips, the other ranks step on the
                          unclipped gradient
  average_gradients       no DDP: the plain module, and the torch.distributed
                          tutorial's average_gradients after the window's
                          last backward (all_reduce(p.grad, SUM), then
                          p.grad /= world_size), before the clip
  clip_then_average       the same with the clip BEFORE the average: each
                          rank clips its own local gradient by its own norm
                          (ddp-clip-before-all-reduce)
--sharding split: each rank takes order[r::R] by hand (Subset), unequal
shards (the scenario's sampler = "split"), instead of DistributedSampler.
--sharding shuffle: DistributedSampler(shuffle=True, seed=1234) with
set_epoch over the data set in its natural order: the trainer's own order
(certify checks its coverage over the ranks and judges what it drew).
"""
import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from accumcheck_torch import exit_on_refusal, load_bundle
from accumcheck_torch.distributed import DistributedRecorder, run_ranks

LOOPS = ("correct", "no_sync_everywhere", "sync_every_micro_step", "local_mean",
         "scheduler_per_rank", "clip_local_norm", "clip_main_only", "average_gradients",
         "clip_then_average")


class Net(torch.nn.Module):
    """The trainer's own model: an MLP (Linear + activation) or the token
    model (Embedding -> Linear)."""

    def __init__(self, bundle):
        super().__init__()
        if bundle.kind == "token":
            self.embed = torch.nn.Embedding(bundle.vocab, bundle.embed)
            self.head = torch.nn.Linear(bundle.embed, bundle.vocab)
            self.layers = None
        else:
            w = bundle.widths
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(w[i], w[i + 1]) for i in range(len(w) - 1))
            self.act = {"tanh": torch.tanh, "relu": torch.relu, "gelu": F.gelu,
                        "identity": lambda t: t}[bundle.activation]

    def forward(self, x):
        if self.layers is None:
            return self.head(self.embed(x))
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = self.act(x)
        return x


def loss_sum(bundle, out, y):
    """The micro-batch's summed per-item loss (MSE: mean over outputs)."""
    if bundle.kind == "token":
        return F.cross_entropy(out.reshape(-1, bundle.vocab), y.reshape(-1),
                               ignore_index=-100, reduction="sum")
    if bundle.loss_kind == "mse":
        return F.mse_loss(out, y, reduction="sum") / bundle.d_out
    return F.cross_entropy(out, y, reduction="sum")


def items(bundle, y):
    return int((y != -100).sum()) if bundle.kind == "token" else int(y.shape[0])


def loader(bundle, epoch, sharding):
    if sharding == "shuffle":  # the trainer's own order, as most DDP loops draw it
        sampler = DistributedSampler(bundle.dataset(), shuffle=True, seed=1234,
                                     drop_last=bundle.sampler == "drop-last")
        sampler.set_epoch(epoch)
        return DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, sampler=sampler)
    data = bundle.dataset(epoch=epoch)  # the epoch's order, dealt as DistributedSampler does
    if sharding == "split":
        shard = Subset(data, range(dist.get_rank(), len(data), dist.get_world_size()))
        return DataLoader(shard, batch_size=bundle.micro_batch, shuffle=False)
    sampler = DistributedSampler(data, shuffle=False, drop_last=bundle.sampler == "drop-last")
    sampler.set_epoch(epoch)
    return DataLoader(data, batch_size=bundle.micro_batch, sampler=sampler)


def clip_own_chunk(model, max_norm):
    """The ZeRO-style clip by hand: the flat gradient in R chunks of
    ceil(P/R); this rank clips its chunk by the chunk's norm, then every
    rank gathers every clipped chunk."""
    params = list(model.parameters())
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    R, q = dist.get_world_size(), dist.get_rank()
    chunk = (flat.numel() + R - 1) // R
    flat = torch.cat([flat, flat.new_zeros(chunk * R - flat.numel())])
    mine = torch.nn.Parameter(torch.zeros(chunk))
    mine.grad = flat[q * chunk:(q + 1) * chunk].clone()
    torch.nn.utils.clip_grad_norm_([mine], max_norm)
    gathered = [torch.empty(chunk) for _ in range(R)]
    dist.all_gather(gathered, mine.grad)
    flat = torch.cat(gathered)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def train(rank, ranks, args):
    bundle = load_bundle(args.bundle)  # this rank's view
    net = Net(bundle)
    bundle.load_initial(net)
    by_hand = args.loop in ("average_gradients", "clip_then_average")
    model = net if by_hand else DDP(net)
    optimizer = bundle.optimizer(model)
    scheduler = bundle.scheduler(optimizer)
    recorder = DistributedRecorder(bundle, model, optimizer, scheduler, out=args.out)
    R = dist.get_world_size()
    loop = args.loop
    for epoch in range(bundle.epochs):
        K = bundle.accumulation_at(epoch)
        batches = list(loader(bundle, epoch, args.sharding))
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n = torch.tensor(float(sum(items(bundle, y) for _, y, _ in window)),
                             dtype=torch.float64)
            if loop != "local_mean":
                dist.all_reduce(n)  # N_w over every rank, before the first backward
            for i, (x, y, _) in enumerate(window):
                last = i + 1 == len(window)
                if by_hand:
                    sync = contextlib.nullcontext()
                elif loop == "no_sync_everywhere":
                    sync = model.no_sync()
                elif loop == "sync_every_micro_step" or last:
                    sync = contextlib.nullcontext()
                else:
                    sync = model.no_sync()
                with sync:
                    out = model(x)
                    if loop == "local_mean":
                        loss = loss_sum(bundle, out, y) / n.item()
                    else:
                        loss = loss_sum(bundle, out, y) * R / n.item()
                    loss.backward()
            if loop == "clip_then_average" and bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)  # local
            if by_hand:
                for p in model.parameters():
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= R
            if bundle.clip and loop != "clip_then_average":
                if loop == "clip_local_norm":
                    clip_own_chunk(model, bundle.max_norm)
                elif loop == "clip_main_only":
                    if rank == 0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            for _ in range(R if loop == "scheduler_per_rank" else 1):
                scheduler.step()
            optimizer.zero_grad()
    recorder.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--loop", choices=LOOPS, default="correct")
    ap.add_argument("--sharding", choices=("sampler", "split", "shuffle"), default="sampler")
    ap.add_argument("--spawn", type=int, metavar="R",
                    help="start R ranks with torch.multiprocessing.spawn (not torchrun)")
    args = ap.parse_args()
    run_ranks(train, args, args.spawn)  # torchrun's environment, or --spawn R


if __name__ == "__main__":
    exit_on_refusal(main)
