"""MISTAKE outside the catalog: the first micro-batch of every window is
counted twice (accumcheck example): a "priming" backward on it before the
window's loop, which then goes over it again.
Expected: "no modelled pitfall explains this trace", with micro-batch 0
weighing 2/N_w.

    python3 train_double_count.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    for epoch in range(bundle.epochs):
        for window in bundle.windows(epoch):
            n_w = sum(len(ids) for ids in window)
            first = window[0]
            bundle.window_loss(model(bundle.x[first]), bundle.y[first], n_w).backward()
            for ids in window:  # the mistake: window[0] again
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
