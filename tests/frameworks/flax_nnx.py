"""Flax NNX (examples/jax/train_optax.py --loop nnx): an nnx.Module MLP,
nnx.Optimizer over optax.inject_hyperparams(optax.adam) with a linear lr decay,
hand accumulation under nnx.jit, micro-batches of 4, K = 4, 44 samples, 2 epochs.

Variants:
  hand   the summed loss's gradients summed over the window, divided by
         its items: PASS"""

import _jax_case

VARIANTS = ["hand"]
LOOPS = {"hand": ["--loop", "nnx"]}

if __name__ == "__main__":
    _jax_case.run(VARIANTS, LOOPS)
