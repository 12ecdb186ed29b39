"""optax.MultiSteps(inner, every_k_schedule=4) over the mean loss's
gradients (examples/jax/train_optax.py --loop multisteps), the inner
optimizer optax.inject_hyperparams(optax.adam), 2 epochs.

Variants:
  equal     micro-batches of 4, 48 samples (3 windows an epoch): its mean
            of micro-batch means is the mean: PASS
  unequal   micro-batches of 2 and 6, 48 samples: the mean of means
            (sample-mean-of-means)
  leftover  micro-batches of 4, 44 samples: its counter runs across the
            epoch's end (sample-mean-of-means+window-counter-across-epochs)"""

import _jax_case

VARIANTS = ["equal", "unequal", "leftover"]
LOOPS = {"equal": ["--loop", "multisteps", "--samples", "48"],
         "unequal": ["--loop", "multisteps", "--samples", "48", "--sizes", "2,6"],
         "leftover": ["--loop", "multisteps"]}

if __name__ == "__main__":
    _jax_case.run(VARIANTS, LOOPS)
