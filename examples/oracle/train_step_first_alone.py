"""MISTAKE outside the catalog: an extra optimizer.step() after the first
micro-batch of every window (a logging hook that steps), so that
micro-batch is stepped alone and the rest of the window at its end
(accumcheck example).
Expected: "no modelled pitfall explains this trace", twice correct's
steps, and micro-batches 1 to K-1 of the first window said to be stepped
at the next step, not skipped.

    python3 train_step_first_alone.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    for epoch in range(bundle.epochs):
        for window in bundle.windows(epoch):
            n_w = sum(len(ids) for ids in window)
            for k, ids in enumerate(window):
                x, y = bundle.x[ids], bundle.y[ids]
                bundle.window_loss(model(x), y, n_w).backward()
                if k == 0:  # the mistake: a step inside the window
                    optimizer.step()
                    optimizer.zero_grad()
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    main()
