"""A correct loop whose K changes from epoch to epoch (accumcheck example).

Seed 002's "cold start" ramps the accumulation steps per epoch
(`accumulation_steps = min(epoch * 2, 8)`); GPT-3 and Megatron-LM ramp the
global batch the same way.  This loop reads K of each epoch from the
bundle, weighs every sample of a window 1/N_w, steps every K_e
micro-batches (and at the epoch's end), and counts its schedule's horizon
the way the ramp actually steps: sum over epochs of ceil(M_e / K_e).

    python3 train_ramp.py --bundle BUNDLE --out TRACE
"""
import math

import torch

from accumcheck_torch import example_session, exit_on_refusal


def horizon(bundle, k_of_epoch):
    """(total, warmup) optimizer steps when epoch e accumulates k_of_epoch(e)."""
    total = sum(math.ceil(len(bundle.micro_batches(e)) / k_of_epoch(e))
                for e in range(bundle.epochs))
    warmup = (math.ceil(total * bundle.warmup_ratio) if bundle.warmup_ratio >= 0
              else bundle.warmup)
    return total, warmup


def train(bundle, model, optimizer, loss_k=None):
    """The loop, yielding after each optimizer.step().  Each micro-batch's
    loss: its samples' losses / N_w (the window's samples), or with loss_k
    the everyday micro-batch mean / loss_k."""
    for epoch in range(bundle.epochs):
        K = bundle.accumulation_at(epoch)
        batches = bundle.micro_batches(epoch)
        for i, (x, y) in enumerate(batches):
            if loss_k is None:
                start = (i // K) * K
                window_items = sum(bundle.items(wy) for _, wy in batches[start:start + K])
                loss = bundle.window_loss(model(x), y, window_items)
            else:
                loss = bundle.loss_mean(model(x), y) / loss_k
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(batches):
                if bundle.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                optimizer.step()
                yield
                optimizer.zero_grad()


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)
    if bundle.schedule in ("linear", "cosine"):
        # Our own horizon, as get_*_schedule_with_warmup(num_training_steps=)
        # is given one; the bundle's scheduler reads these.
        bundle.total, bundle.warmup = horizon(bundle, bundle.accumulation_at)
    for _ in train(bundle, model, optimizer):
        scheduler.step()
    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
