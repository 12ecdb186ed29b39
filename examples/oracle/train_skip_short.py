"""MISTAKE: DataLoader(drop_last=True) (accumcheck example): the short last
micro-batch of every epoch is never drawn, so its samples are never seen.
The loop itself is correct (1/N_w over what it drew).
Expected diagnosis: skip-short-micro-batch.

    python3 train_skip_short.py --bundle BUNDLE --out TRACE
"""

import torch
from torch.utils.data import DataLoader

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)
    loader = DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, shuffle=False,
                        drop_last=True)  # the mistake
    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        batches = list(loader)
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n_w = sum(int(y.shape[0]) for _, y, _ in window)
            for x, y, _ in window:
                bundle.window_loss(model(x), y, n_w).backward()
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
