"""A correct gradient-accumulation loop (accumcheck example).

Every sample of a window weighs 1/N_w (N_w: the window's samples), so the
short last window of an epoch is normalized by its own size; clipping once
per window on the accumulated gradient; optimizer.step, scheduler.step and
zero_grad once per window.

    python3 train_correct.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        batches = bundle.micro_batches(epoch)
        for i, (x, y) in enumerate(batches):
            window = batches[(i // K) * K:(i // K) * K + K]
            window_items = sum(bundle.items(wy) for _, wy in window)
            loss = bundle.window_loss(model(x), y, window_items)
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(batches):
                if bundle.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
