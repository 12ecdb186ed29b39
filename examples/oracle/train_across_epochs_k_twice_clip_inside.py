"""MISTAKES, five at once (issue 44): the four of
train_across_epochs_k_twice.py and clip_grad_norm_ after every backward
(clip-per-micro-step).

    python3 train_across_epochs_k_twice_clip_inside.py --bundle BUNDLE --out TRACE
"""

from accumcheck_torch import exit_on_refusal
from train_across_epochs_k_twice import main

if __name__ == "__main__":
    exit_on_refusal(lambda: main(clip_inside=True, doc=__doc__))
