"""optax, a hand-written accumulation loop under jax.jit
(examples/jax/train_optax.py): an MLP classifier, micro-batches of 4, K = 4,
44 samples (each epoch's last window holds 3 micro-batches), 2 epochs,
optax.inject_hyperparams(optax.adam) on a linear schedule.

Variants:
  correct      the summed loss's gradients summed over the window, divided
               by its items (the short window too): PASS
  mean_over_k  the mean loss's gradients summed, divided by K, the short
               window too: partial-cycle-scale-by-k"""

import _jax_case

VARIANTS = ["correct", "mean_over_k"]
LOOPS = {"correct": ["--loop", "hand"], "mean_over_k": ["--loop", "mean_over_k"]}

if __name__ == "__main__":
    _jax_case.run(VARIANTS, LOOPS)
