"""Transformers Trainer, correct usage: a tiny LlamaForCausalLM (from a
config), 24 variable-length sequences padded with -100, micro-batches of 2
(12 per epoch: 3 windows of 4), gradient_accumulation_steps=4, 2 epochs,
torch SGD without momentum, constant lr, no clipping (max_grad_norm=0).

A correct Trainer steps 6 times, each on the window's summed token loss /
the window's label-token count (exact large-batch equivalence): PASS.
Transformers <= 4.45 divides each micro-batch's token mean by K:
token-mean-of-means.  (The epoch's batch count is a multiple of K here, so
the token weighting shows alone; transformers_partial.py has a partial
last window.)"""

import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import case_args, exit_on_refusal, tiny_llama  # noqa: E402
from _transformers import train  # noqa: E402

if __name__ == "__main__":
    exit_on_refusal(train, case_args(__doc__), tiny_llama(), optim="sgd", lr=0.1)
