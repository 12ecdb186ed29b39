"""Transformers Trainer with a partial last window and a cosine schedule:
the partial case (the tiny LlamaForCausalLM, 22 variable-length
sequences, micro-batches of 2: 11 per epoch, windows 4, 4, 3,
gradient_accumulation_steps=4, 2 epochs, SGD without momentum, lr 0.1, no
clipping) with lr_scheduler_type="cosine" and a warmup of 0.25 of the
Trainer's step budget (warmup_ratio; Transformers 5: warmup_steps=0.25).

A correct Trainer steps 6 times, its cosine over 6 steps with
ceil(0.25 x 6) = 2 warmup steps: PASS.  A release whose budget is
epochs x floor(11 / 4) = 4 steps (4.45-4.51) also sizes the schedule by
it: 1 warmup step and a cosine that reaches 0 at step 4
(step-budget-drops-micro-batches sets the horizon too), on top of what
the release does to the windows (its partial cell)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import case_args, exit_on_refusal, tiny_llama  # noqa: E402
from _transformers import train  # noqa: E402

if __name__ == "__main__":
    exit_on_refusal(train, case_args(__doc__), tiny_llama(), n=22, optim="sgd", lr=0.1,
                    schedule="cosine", warmup_ratio=0.25)
