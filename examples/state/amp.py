"""Mixed precision with PyTorch's own torch.amp.GradScaler("cpu") on the
certify-mlp bundle (accumcheck state example): autocast the forward in
float16 (or bfloat16), scale each micro-batch's loss, and once per window
unscale_, clip, step and update, as PyTorch's AMP recipe for gradient
accumulation writes it.  A step the scaler skips (inf/NaN in the gradient)
must not advance the LR scheduler: the scale before and after update()
tells (update() lowers it on a skip).  examples/state/scaled.py has the
hand-written scaler DeepSpeed and Megatron carry instead.

    python examples/state/amp.py --bundle BUNDLE --out TRACE --variant correct
    variants: correct (float16 autocast), bf16 (bfloat16 autocast),
              clip_before_unscale (MISTAKE: clip_grad_norm_ on the scaled
              gradient, then unscale_),
              skip_advances_scheduler (MISTAKE: scheduler.step() also on a
              skipped step; the scaler starts at 2^24, so float16's range
              overflows and the first steps are skipped)

scaler-update-every-micro-step cannot be written with PyTorch's GradScaler:
update() without an unscale_ or step since the last one raises "No inf
checks were recorded prior to update."  It is a pitfall of hand-written
scalers (examples/state/scaled.py --variant scaler_per_micro).
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", default="correct",
                    choices=["correct", "bf16", "clip_before_unscale", "skip_advances_scheduler"])
    args = ap.parse_args()

    bundle = load_bundle(args.bundle)
    model = Regressor(bundle.d_in, bundle.widths[1], bundle.d_out)
    bundle.load_initial(model)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=bundle.lr, momentum=bundle.momentum,
                                weight_decay=bundle.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bundle.lr_multiplier)
    init = 2.0 ** 24 if args.variant == "skip_advances_scheduler" else 2.0 ** 16
    scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=2)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out, quiet=True,
                        loss_scale=scaler.get_scale)
    dtype = torch.bfloat16 if args.variant == "bf16" else torch.float16

    K = bundle.accumulation
    loader = DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, shuffle=False)
    for epoch in range(bundle.epochs):
        batches = list(loader)
        for i, (x, y, _) in enumerate(batches):
            start = (i // K) * K
            n_w = sum(len(b[1]) for b in batches[start:start + K])
            with torch.autocast("cpu", dtype=dtype):
                out = model(x)
            loss = F.mse_loss(out.float(), y, reduction="sum") / (bundle.d_out * n_w)
            scaler.scale(loss).backward()
            if (i + 1) % K == 0 or i + 1 == len(batches):
                if args.variant == "clip_before_unscale":
                    torch.nn.utils.clip_grad_norm_(params, bundle.max_norm)  # the mistake
                    scaler.unscale_(optimizer)
                else:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, bundle.max_norm)
                before = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                skipped = scaler.get_scale() < before
                if not skipped or args.variant == "skip_advances_scheduler":
                    scheduler.step()
                optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
