"""MISTAKE: K ramps per epoch, but the loss is divided by the K read once
before the epoch loop (accumcheck example; certify says
ramp-normalization-stale).

    python3 train_ramp_stale_k.py --bundle BUNDLE --out TRACE
"""

from accumcheck_torch import example_session, exit_on_refusal
from train_ramp import horizon, train


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)
    if bundle.schedule in ("linear", "cosine"):
        bundle.total, bundle.warmup = horizon(bundle, bundle.accumulation_at)
    K0 = bundle.accumulation_at(0)  # the mistake: never updated
    for _ in train(bundle, model, optimizer, loss_k=K0):
        scheduler.step()
    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
