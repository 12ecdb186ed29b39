"""MISTAKE: `loss / K` everywhere, so the short last window of an epoch
(r < K micro-batches) is still divided by K (accumcheck example; Lightning
and Accelerate do this).  Expected diagnosis: partial-cycle-scale-by-k.

    python3 train_partial_div_k.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    K = bundle.accumulation
    for epoch in range(bundle.epochs):
        batches = bundle.micro_batches(epoch)
        for i, (x, y) in enumerate(batches):
            loss = bundle.loss_mean(model(x), y) / K  # the mistake on short windows
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
