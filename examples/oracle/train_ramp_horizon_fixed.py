"""MISTAKE: K ramps per epoch, but the schedule's horizon (and its warmup
ratio) is computed once with the initial K, as if every epoch took
ceil(M / K_0) steps (accumcheck example; certify says
ramp-schedule-horizon-fixed).

    python3 train_ramp_horizon_fixed.py --bundle BUNDLE --out TRACE
"""

from accumcheck_torch import example_session, exit_on_refusal
from train_ramp import horizon, train


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)
    K0 = bundle.accumulation_at(0)
    # The mistake: num_training_steps from the first epoch's K.
    bundle.total, bundle.warmup = horizon(bundle, lambda epoch: K0)
    for _ in train(bundle, model, optimizer):
        scheduler.step()
    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
