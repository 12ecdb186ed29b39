"""A correct loop that starts backward through torch.autograd.backward
(accumcheck example), as wrappers and custom training steps do; zero_grad
with set_to_none at the top of each window.

    python3 train_autograd_backward.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    for epoch in range(bundle.epochs):
        for window in bundle.windows(epoch):
            optimizer.zero_grad(set_to_none=True)
            n_w = sum(len(ids) for ids in window)
            for ids in window:
                idx = torch.tensor(ids)
                x, y = bundle.x[idx], bundle.y[idx]
                loss = bundle.window_loss(model(x), y, n_w)
                torch.autograd.backward(loss)
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
