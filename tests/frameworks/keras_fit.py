"""Keras 3 `model.fit` with `optimizer(..., gradient_accumulation_steps=4)`
on the JAX backend (and torch_*: the torch backend), recorded by accumcheck_jax.KerasRecorder: the cases of
examples/jax/train_keras.py (a small MLP classifier, batch_size 4 (sum_loss 8), 2
epochs, Keras's default loss reduction, the batch mean), one cell each.
Run in a venv with keras and a jax of its time (bench/conformance.py's
JAX-side venvs); KERAS_BACKEND=jax is set here.

Variants:
  correct   48 samples, Adam: PASS
  adamw     48 samples, AdamW(weight_decay=0.1): PASS from keras 3.5.0 on;
            before it (PR #19998, issue #19990) the decay ran on every
            micro-step: the parameters move on calls that apply no update
            (the trace's idle rows): optimizer-state-every-micro-step
  uneven    46 samples: the last batch of 2 weighs as the others:
            sample-mean-of-means
  leftover  44 samples: the optimizer's window counter runs across epochs
  sum_loss  reduction="sum": each batch's summed loss / K, 64 samples in
            batches of 8: summed-loss-divided-by-k
  schedule  ExponentialDecay(staircase) over optimizer steps, evaluated by
            Keras at its micro-batch counter: scheduler-per-micro-step
  dropout   correct's fit of a model with BatchNormalization and Dropout:
            PASS (the fit judged without float64 calibration)
  torch_*   the same on Keras's torch backend (KERAS_BACKEND=torch, the
            venv's torch 2.13.0)"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "jax"))

VARIANTS = ["correct", "adamw", "uneven", "leftover", "sum_loss", "schedule", "dropout",
            "torch_correct", "torch_adamw", "torch_uneven", "torch_schedule", "torch_dropout"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", choices=VARIANTS + ["default"], default=VARIANTS[0])
    ap.add_argument("--no-record", action="store_true", help="the same run without recording")
    ap.add_argument("--identity", metavar="PATH",
                    help="the fit without the recorder first, then recorded, in this process: "
                    "both runs' weight digests to PATH.rank0")
    a = ap.parse_args(argv)
    backend = "torch" if a.variant.startswith("torch_") else "jax"
    os.environ["KERAS_BACKEND"] = backend   # before keras is imported
    variant = a.variant[len("torch_"):] if backend == "torch" else a.variant
    case = {"correct": "fit", "default": "fit"}.get(variant, variant)
    import train_keras
    args = ["--case", case, "--out", a.out, "--quiet"] + (["--no-record"] if a.no_record else []) \
        + (["--identity", a.identity] if a.identity else [])
    train_keras.main(args)
    return 0


if __name__ == "__main__":
    from accumcheck_jax import exit_on_refusal
    sys.exit(exit_on_refusal(main))
