"""MISTAKE: the linear scaling rule, lr multiplied by K because the
effective batch is K times larger (accumcheck example).  The accumulation
itself is correct.
Expected: lr-scaled-by-k, the lr channel saying "lr at every step is K x
the schedule".

    python3 train_lr_times_k.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import exit_on_refusal, load_bundle, Recorder


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bundle = load_bundle(args.bundle)
    model = bundle.model()
    K = bundle.accumulation
    optimizer = torch.optim.SGD(model.parameters(), lr=bundle.lr * K,  # the mistake
                                momentum=bundle.momentum, weight_decay=bundle.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bundle.lr_multiplier)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out)

    for epoch in range(bundle.epochs):
        for window in bundle.windows(epoch):
            n_w = sum(len(ids) for ids in window)
            for ids in window:
                x, y = bundle.x[ids], bundle.y[ids]
                bundle.window_loss(model(x), y, n_w).backward()
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
