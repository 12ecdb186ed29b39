"""MISTAKE: scheduler.step() once per epoch, the Keras habit, with a
schedule whose warmup and horizon count optimizer steps (accumcheck
example): the lr is constant within each epoch.
Expected diagnosis: scheduler-per-epoch.

    python3 train_scheduler_per_epoch.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    for epoch in range(bundle.epochs):
        for window in bundle.windows(epoch):
            n_w = sum(len(ids) for ids in window)
            for ids in window:
                x, y = bundle.x[ids], bundle.y[ids]
                bundle.window_loss(model(x), y, n_w).backward()
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()  # the mistake: once per epoch

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
