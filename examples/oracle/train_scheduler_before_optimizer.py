"""MISTAKE: scheduler.step() before optimizer.step() (accumcheck example):
every optimizer step uses the lr meant for the next one (PyTorch warns
once and goes on).
Expected diagnosis: scheduler-before-optimizer.

    python3 train_scheduler_before_optimizer.py --bundle BUNDLE --out TRACE
"""
import warnings

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)
    warnings.filterwarnings("ignore", message="Detected call of")

    for epoch in range(bundle.epochs):
        for window in bundle.windows(epoch):
            n_w = sum(len(ids) for ids in window)
            for ids in window:
                x, y = bundle.x[ids], bundle.y[ids]
                bundle.window_loss(model(x), y, n_w).backward()
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            scheduler.step()  # the mistake: before optimizer.step()
            optimizer.step()
            optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
