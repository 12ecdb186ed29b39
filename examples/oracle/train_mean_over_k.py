"""The everyday correct loop (accumcheck example): `loss = criterion / K`.

The loop most people write: the micro-batch mean divided by K, backward,
and every K micro-batches clip, step, schedule and zero.  It is correct
when every window holds K micro-batches of equal size (no short
micro-batch, no partial window), which the scenarios it is certified on
have; with a partial window it is partial-cycle-scale-by-k, and on token
losses with unequal lengths it is token-mean-of-means (the 2024
Transformers bug).  `bundle.loss_mean` is the usual mean criterion: MSE,
cross-entropy, or token cross-entropy with ignore_index.

    python3 train_mean_over_k.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        for i, (x, y) in enumerate(bundle.micro_batches(epoch)):
            loss = bundle.loss_mean(model(x), y) / K  # criterion(out, y) / K
            loss.backward()
            if (i + 1) % K == 0:
                if bundle.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
