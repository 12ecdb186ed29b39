"""MISTAKE: clip_grad_norm_ after every backward, inside the accumulation
loop (accumcheck example): it clips the running partial sum.
Expected diagnosis: clip-per-micro-step.

    python3 train_clip_inside.py --bundle BUNDLE --out TRACE
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
            if bundle.clip:  # the mistake: clipping every micro-batch
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            if (i + 1) % K == 0 or i + 1 == len(batches):
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
