"""MISTAKE: the step condition of seeds 002 and 004, `if step % K == 0` on
the 0-based counter of enumerate() (accumcheck example): the first window
holds one micro-batch, every later window is shifted by one, and the
epoch's leftover micro-batches are neither stepped nor zeroed.
Expected diagnosis: window-boundary-off-by-one.

    python3 train_window_off_by_one.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        for step, (x, y) in enumerate(bundle.micro_batches(epoch)):
            loss = bundle.loss_mean(model(x), y) / K
            loss.backward()
            if step % K == 0:  # the mistake: (step + 1) % K == 0 was meant
                if bundle.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
