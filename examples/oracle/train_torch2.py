"""The correct loop in PyTorch 2's idioms (accumcheck example): an
optimizer implementation of your choice (the for-loop default, foreach=True
or fused=True), and zero_grad() with PyTorch 2's default (set_to_none=True:
the gradients become None) or set_to_none=False (zeroed in place).

    python examples/oracle/train_torch2.py --bundle BUNDLE --out TRACE \\
        [--impl default|foreach|fused] [--set-to-none true|false]
"""
import argparse

import torch

from accumcheck_torch import exit_on_refusal, load_bundle, Recorder


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, help="accumcheck export folder")
    ap.add_argument("--out", required=True, help="trace folder to write")
    ap.add_argument("--impl", choices=("default", "foreach", "fused"), default="default",
                    help="the optimizer's implementation")
    ap.add_argument("--set-to-none", choices=("true", "false"), default="true",
                    help="zero_grad(set_to_none=...): PyTorch 2's default is true")
    args = ap.parse_args()

    bundle = load_bundle(args.bundle)
    model = bundle.model()
    options = {} if args.impl == "default" else {args.impl: True}
    optimizer = bundle.optimizer(model, **options)
    scheduler = bundle.scheduler(optimizer)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out, quiet=True)
    set_to_none = args.set_to_none == "true"

    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        batches = bundle.micro_batches(epoch)
        for i, (x, y) in enumerate(batches):
            window = batches[(i // K) * K:(i // K) * K + K]
            window_items = sum(bundle.items(wy) for _, wy in window)
            bundle.window_loss(model(x), y, window_items).backward()
            if (i + 1) % K == 0 or i + 1 == len(batches):
                if bundle.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=set_to_none)

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
