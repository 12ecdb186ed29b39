"""Loss-scaled training loops on the certify-mlp bundle (accumcheck state
examples), with the dynamic loss scaler a trainer carries in its own code
(PyTorch 1.13's GradScaler is CUDA-only; DeepSpeed and Megatron write
theirs the same way): scale the loss, unscale the accumulated gradient once
before clip and step, skip the step on inf/NaN, halve the scale on
overflow, double it after `growth_interval` clean steps.

    python3 scaled.py --bundle BUNDLE --out TRACE --variant correct
    variants: correct, bf16 (the correct loop under torch.autocast bfloat16),
              bf16_zero_grad_inside (MISTAKE, under bf16 autocast: zero_grad()
              at the top of the micro-batch loop, so only the last
              micro-batch of each window reaches the clip and the step),
              scaler_per_micro (scaler.update() after every backward),
              skip_advances_scheduler (scheduler.step() also on a skipped step;
              the scaler starts above float32's range, so it skips at once),
              clip_before_unscale (clip_grad_norm_ on the still-scaled
              gradient, then unscale_: seed 002's GradScaler + clipping
              order, which clips by the scaled norm),
              rescaled_accumulator (buf = 2*buf + g: the accumulated .grad
              doubled before every backward of a window but its first,
              Megatron-LM #6660)
"""
import argparse
import contextlib

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


class DynamicLossScaler:
    def __init__(self, init_scale=2.0 ** 16, growth_interval=2):
        self.scale = init_scale
        self.growth_interval = growth_interval
        self.clean = 0

    def has_overflow(self, params):
        return any(p.grad is not None and not torch.isfinite(p.grad).all() for p in params)

    def unscale_(self, params):
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.scale)

    def update(self, overflow):
        if overflow:
            self.scale *= 0.5
            self.clean = 0
        else:
            self.clean += 1
            if self.clean == self.growth_interval:
                self.scale *= 2.0
                self.clean = 0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", default="correct",
                    choices=["correct", "bf16", "bf16_zero_grad_inside", "scaler_per_micro",
                             "skip_advances_scheduler", "clip_before_unscale",
                             "rescaled_accumulator"])
    args = ap.parse_args()

    bundle = load_bundle(args.bundle)
    model = Regressor(bundle.d_in, bundle.widths[1], bundle.d_out)
    bundle.load_initial(model)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=bundle.lr, momentum=bundle.momentum,
                                weight_decay=bundle.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bundle.lr_multiplier)
    init = 2.0 ** 128 if args.variant == "skip_advances_scheduler" else 2.0 ** 16
    scaler = DynamicLossScaler(init_scale=init)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out,
                        loss_scale=lambda: scaler.scale)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.variant.startswith("bf16")
                else contextlib.nullcontext())

    K = bundle.accumulation
    loader = DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, shuffle=False)
    for epoch in range(bundle.epochs):
        batches = list(loader)
        for i, (x, y, _) in enumerate(batches):
            start = (i // K) * K
            n_w = sum(len(b[1]) for b in batches[start:start + K])
            if args.variant == "bf16_zero_grad_inside":
                optimizer.zero_grad()  # the mistake
            if args.variant == "rescaled_accumulator" and i % K != 0:
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(2)  # the mistake: buf = 2*buf + g
            with autocast:
                out = model(x)
            loss = F.mse_loss(out.float(), y, reduction="sum") / (bundle.d_out * n_w)
            (loss * scaler.scale).backward()
            if args.variant == "scaler_per_micro":
                scaler.update(scaler.has_overflow(params))
            if (i + 1) % K == 0 or i + 1 == len(batches):
                if args.variant == "clip_before_unscale":
                    torch.nn.utils.clip_grad_norm_(params, bundle.max_norm)  # the mistake
                scaler.unscale_(params)
                overflow = scaler.has_overflow(params)
                if not overflow:
                    if args.variant != "clip_before_unscale":
                        torch.nn.utils.clip_grad_norm_(params, bundle.max_norm)
                    optimizer.step()
                    scheduler.step()
                elif args.variant == "skip_advances_scheduler":
                    scheduler.step()
                if args.variant != "scaler_per_micro":
                    scaler.update(overflow)
                optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
