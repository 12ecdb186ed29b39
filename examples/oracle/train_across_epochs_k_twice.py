"""MISTAKES, four at once (issue 44), as framework releases combine them:
each micro-batch's mean loss divided by K (sample-mean-of-means) by the
user and again by a framework's backward (loss-divided-by-k-twice), the
step decided on a micro-batch counter that runs across epochs
(window-counter-across-epochs: an epoch's leftovers join the next epoch's
first window, the run's are never stepped), and scheduler.step() after
every micro-batch (scheduler-per-micro-step).  Expected diagnosis:
sample-mean-of-means+scheduler-per-micro-step+window-counter-across-epochs+loss-divided-by-k-twice.

    python3 train_across_epochs_k_twice.py --bundle BUNDLE --out TRACE
"""

import torch

from accumcheck_torch import example_session, exit_on_refusal


def main(clip_inside=False, doc=__doc__):
    bundle, model, optimizer, scheduler, recorder = example_session(doc)

    K = bundle.accumulation
    total = 0  # the mistake: never reset at an epoch's start
    for epoch in range(bundle.epochs):
        for x, y in bundle.micro_batches(epoch):
            loss = bundle.loss_mean(model(x), y) / K / K  # /K twice
            loss.backward()
            if bundle.clip and clip_inside:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            total += 1
            if total % K == 0:
                if bundle.clip and not clip_inside:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                optimizer.step()
                optimizer.zero_grad()
            scheduler.step()  # every micro-batch

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
