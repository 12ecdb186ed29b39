"""A correct loop on the trainer's own DataLoader (accumcheck example):
shuffle with its own generator and drop_last, over bundle.dataset(); the
window's item count is taken before its first backward (the Transformers
`num_items_in_batch` way).  Certify judges the accumulation on the
micro-batches this loader drew and checks order and coverage separately.

    python3 train_own_loader.py --bundle BUNDLE --out TRACE
"""

import torch
from torch.utils.data import DataLoader

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)
    loader = DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, shuffle=True,
                        drop_last=True, generator=torch.Generator().manual_seed(1234))
    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        batches = list(loader)
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            num_items = sum(int(y.shape[0]) for _, y, _ in window)
            for x, y, ids in window:
                loss = bundle.window_loss(model(x), y, num_items)
                loss.backward()
            if bundle.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
