"""Transformers Trainer with a partial last window: the tiny
LlamaForCausalLM, 22 variable-length sequences padded with -100,
micro-batches of 2 (11 per epoch: windows 4, 4, 3),
gradient_accumulation_steps=4, 2 epochs, SGD without momentum, constant
lr, no clipping.

A correct Trainer steps 3 times per epoch, 6 in all, the 3-micro-batch
window on its own token count: PASS.  Transformers 4.45 counts its step
budget as epochs * floor(11 / 4) = 4 and cuts windows on a counter that
runs across epochs: epoch 0's last 3 micro-batches leak into epoch 1's
first window and the run stops after 4 steps, 6 micro-batches of epoch 1
never drawn (with token-mean-of-means on every window)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import case_args, exit_on_refusal, tiny_llama  # noqa: E402
from _transformers import train  # noqa: E402

if __name__ == "__main__":
    exit_on_refusal(train, case_args(__doc__), tiny_llama(), n=22, optim="sgd", lr=0.1)
