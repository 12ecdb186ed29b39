"""A float32 loop on float32 master weights whose gradient accumulation
buffer is kept in bfloat16 (DeepSpeed #1800 and #2768, trl #2175): every
backward's fresh gradient arrives rounded to bf16 and the running sum is
rounded to bf16 after each addition, as a bf16 .grad accumulates
(s = rnd(s + rnd(g))): once the sum is 2^8 times a contribution, the
contribution is lost (in bf16, 256 + 1 = 256).

    python3 buffers.py --bundle BUNDLE --out TRACE --variant bf16_buffer|fp32_buffer
    fp32_buffer: the fix, the same loop accumulating in float32.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from accumcheck_torch import exit_on_refusal, load_bundle, Recorder


class Regressor(nn.Module):
    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.encoder = nn.Linear(d_in, hidden)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.head(torch.tanh(self.encoder(x)))


def bf16_grad_buffer(params):
    """Keeps every .grad a bf16 number: the fresh gradient rounded before
    autograd adds it, the sum rounded once the backward has finished (a
    callback queued on autograd's engine, so the buffer is bf16 before
    anything reads it)."""
    state = {"queued": False}

    def round_sums():
        state["queued"] = False
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.copy_(p.grad.to(torch.bfloat16))

    def hook(g):
        if not state["queued"]:
            state["queued"] = True
            torch.autograd.Variable._execution_engine.queue_callback(round_sums)
        return g.to(torch.bfloat16).to(g.dtype)

    for p in params:
        p.register_hook(hook)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", default="bf16_buffer", choices=["bf16_buffer", "fp32_buffer"])
    args = ap.parse_args()

    bundle = load_bundle(args.bundle)
    model = Regressor(bundle.d_in, bundle.widths[1], bundle.d_out)
    bundle.load_initial(model)
    params = list(model.parameters())
    if args.variant == "bf16_buffer":
        bf16_grad_buffer(params)  # the mistake (before the recorder's hooks)
    optimizer = torch.optim.SGD(params, lr=bundle.lr, momentum=bundle.momentum,
                                weight_decay=bundle.weight_decay)
    recorder = Recorder(bundle, model, optimizer, out=args.out)

    K = bundle.accumulation
    loader = DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, shuffle=False)
    for epoch in range(bundle.epochs):
        batches = list(loader)
        for i, (x, y, _) in enumerate(batches):
            start = (i // K) * K
            n_w = sum(len(b[1]) for b in batches[start:start + K])
            loss = F.mse_loss(model(x), y, reduction="sum") / (bundle.d_out * n_w)
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(batches):
                optimizer.step()
                optimizer.zero_grad()
    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
