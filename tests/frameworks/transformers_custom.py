"""Transformers Trainer on a model of our own: an nn.Module (embedding,
GRU, head) whose forward(input_ids, attention_mask=None, labels=None) takes
no **kwargs and returns {'loss': token mean, 'logits'}, as many user
models do.  24 variable-length sequences padded with -100, micro-batches of
2 (3 windows of 4), gradient_accumulation_steps=4, 2 epochs, SGD without
momentum, constant lr, no clipping; the summed loss is the standard
causal-LM one (head='causal_lm').

A correct Trainer gives exact large-batch equivalence: PASS.  A Trainer
that cannot hand such a model num_items_in_batch and divides its token
mean by K weighs a token 1/(K*T_k): token-mean-of-means.

Variants: head (head='causal_lm', as above); nohead: the same model with
no head= (nor loss_fn=): the callback cannot derive its summed loss and
exits 2 before training, saying what to pass."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import TinyCausal, case_args, exit_on_refusal  # noqa: E402
from _transformers import train  # noqa: E402

VARIANTS = ["head", "nohead"]

if __name__ == "__main__":
    args = case_args(__doc__)
    head = {} if args.variant == "nohead" else {"head": "causal_lm"}
    exit_on_refusal(train, args, TinyCausal(), optim="sgd", lr=0.1, **head)
