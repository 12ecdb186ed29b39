"""Transformers Trainer on 2 gloo ranks (the env:// rendezvous torchrun
would give; the Trainer initialises the group): the tiny LlamaForCausalLM,
40 variable-length sequences padded with -100 (each rank's micro-batches
hold different token counts), micro-batches of 2 (10 per rank per epoch:
windows 4, 4, 2), gradient_accumulation_steps=4, 2 epochs, SGD without
momentum, constant lr, no clipping.

A correct Trainer makes every token of the step (both ranks, every
micro-batch) weigh 1/T, T the step's label tokens over both ranks: PASS.
Dividing by each rank's own count before DDP averages the ranks:
ddp-token-mean-across-ranks."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import case_args, spawn_ranks, tiny_llama  # noqa: E402
from _transformers import train  # noqa: E402


def rank_main(rank, ranks, args):
    train(args, tiny_llama(), n=40, optim="sgd", lr=0.1)


if __name__ == "__main__":
    args = case_args(__doc__)
    spawn_ranks(rank_main, args.ranks if args.ranks > 1 else 2, args)
