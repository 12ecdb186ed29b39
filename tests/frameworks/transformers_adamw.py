"""Transformers Trainer, everyday usage: the tiny LlamaForCausalLM, 22
variable-length sequences padded with -100, micro-batches of 2 (3 windows
of 4 per epoch), gradient_accumulation_steps=4, 2 epochs, the Trainer's
own AdamW (optim='adamw_torch', lr 3e-3), lr_scheduler_type='linear' with
warmup_steps=2, max_grad_norm=1.0.

A correct Trainer steps 6 times, each on the window's summed token loss /
its label-token count, clipped to norm 1 once per step, at the lr of the
linear schedule over 6 steps (2 of warmup): PASS.  Adam hides a constant
scale, so a token-mean-of-means Trainer still shows in the fitted weights
(and the clip factors)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import case_args, exit_on_refusal, tiny_llama  # noqa: E402
from _transformers import train  # noqa: E402

if __name__ == "__main__":
    exit_on_refusal(train, case_args(__doc__), tiny_llama(), optim="adamw", lr=3e-3, schedule="linear",
          warmup=2, clip=1.0)
