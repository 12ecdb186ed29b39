"""A DeepSpeed trainer (CPU, gloo) with gradient accumulation, recorded for
the contract tier: deepspeed.initialize with gradient_accumulation_steps K,
ZeRO stage 0, 1 or 2, optionally offload_optimizer to the CPU (ZeRO-Offload,
seed 002's case) and bf16 with a float32 accumulation buffer.

    pip install deepspeed==0.19.8          # beside torch; DS_ACCELERATOR=cpu
    python3 deepspeed_train.py --out T --stage 2 --spawn 2
    accumcheck certify --contract --trace T

Loops (--loop):
  correct            the engine's own loop: engine.backward(mean loss) and
                     engine.step() on every micro-batch (DeepSpeed divides by
                     K and decides the boundary)
  div_k_twice        the loss divided by K before engine.backward, which
                     divides by K again: every gradient 1/K too small
  step_at_boundary   engine.step() only every K-th micro-batch, as a plain
                     PyTorch loop steps: the engine counts one micro-step per
                     call, so it steps once every K*K micro-batches
  bad_batch          train_batch_size that is not micro batch x K x ranks:
                     DeepSpeed refuses it, passed on as bad input (exit 2)
--no-record: the same loop without the recorder; --identity PATH: without
it, then with it, in this process (each rank's trained module must be the
same bits: identity.py).
"""
import argparse
import functools
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contract"))
import identity  # noqa: E402
from accumcheck_torch import exit_on_refusal  # noqa: E402
from accumcheck_torch.deepspeed import DeepSpeedRecorder, initialize  # noqa: E402
from accumcheck_torch.distributed import run_ranks  # noqa: E402

LOOPS = ("correct", "div_k_twice", "step_at_boundary", "bad_batch")


class MLP(torch.nn.Module):
    def __init__(self, d=16, h=32, classes=4):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(d, h), torch.nn.Linear(h, classes)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


def data(n, d=16, classes=4):
    g = torch.Generator().manual_seed(0)
    return list(zip(torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)))


def summed_loss(model, batch):
    x, y = batch
    x = x.to(next(model.parameters()).dtype)
    return F.cross_entropy(model(x).float(), y, reduction="sum")


def items(batch):
    return int(batch[1].shape[0])


def config(a, ranks):
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch,
           "gradient_accumulation_steps": a.K,
           "train_batch_size": a.micro_batch * a.K * ranks + (a.micro_batch if a.loop == "bad_batch" else 0),
           "zero_optimization": {"stage": a.stage},
           "steps_per_print": 10 ** 9}
    if a.offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        # DeepSpeedCPUAdam (seed 002's ZeRO-Offload) or, with --torch-adam,
        # torch's AdamW stepping the offloaded partitions.
        cfg["zero_force_ds_cpu_optimizer"] = not a.torch_adam
    if a.bf16:
        cfg["bf16"] = {"enabled": True}
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
        if a.comm_fp32:
            # The gradient reduction in float32 too (DeepSpeed's default
            # under bf16 is a bfloat16 reduction of the accumulated buffer).
            cfg["communication_data_type"] = "fp32"
    return cfg


def train(rank, ranks, a):
    # What the deepspeed launcher would set (these ranks are spawned here).
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = MLP()
    if a.offload and not a.torch_adam:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam(net.parameters(), lr=1e-3, weight_decay=0.01, adamw_mode=True)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    engine = initialize(config(a, ranks), model=net, optimizer=opt)
    c0 = time.process_time()
    rec = None if a.no_record else DeepSpeedRecorder(engine, summed_loss, items, out=a.out, lr=1e-3)
    K = engine.gradient_accumulation_steps()
    samples = data(a.samples)
    sampler = DistributedSampler(samples, shuffle=True, seed=1234)
    dtype = next(engine.module.parameters()).dtype
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        loader = DataLoader(samples, batch_size=a.micro_batch, sampler=sampler)
        for i, (x, y) in enumerate(rec.watch(loader) if rec else loader):
            loss = F.cross_entropy(engine(x.to(dtype) if dtype != x.dtype else x).float(), y)
            if a.loop == "div_k_twice":
                loss = loss / K
            engine.backward(loss)
            if a.loop != "step_at_boundary" or (i + 1) % K == 0:
                engine.step()
    if rec:
        rec.close()
    if not a.quiet:
        print("rank %d: %.3f s cpu in the loop%s" % (rank, time.process_time() - c0,
                                                    " (not recorded)" if a.no_record else ""))
    return engine.module


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--loop", choices=LOOPS, default="correct")
    ap.add_argument("--stage", type=int, choices=(0, 1, 2), default=0)
    ap.add_argument("--offload", action="store_true", help="offload_optimizer: {device: cpu}")
    ap.add_argument("--torch-adam", action="store_true",
                    help="with --offload: torch's AdamW instead of DeepSpeedCPUAdam")
    ap.add_argument("--bf16", action="store_true", help="bf16 with a float32 gradient accumulation buffer")
    ap.add_argument("--comm-fp32", action="store_true",
                    help="with --bf16: communication_data_type fp32 (the gradient reduced in float32)")
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--no-record", action="store_true", help="the same loop without the recorder (timing)")
    ap.add_argument("--quiet", action="store_true", help="print no timing")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; each rank "
                    "writes both runs' parameter digests to PATH.rank<r> (identity.py)")
    ap.add_argument("--spawn", type=int, metavar="R",
                    help="start R ranks with torch.multiprocessing.spawn (not the deepspeed launcher)")
    a = ap.parse_args()
    run = functools.partial(identity.twice, train, a.identity) if a.identity else train
    run_ranks(run, a, a.spawn)  # each rank ends through exit_rank (issue 42)


if __name__ == "__main__":
    exit_on_refusal(main)
