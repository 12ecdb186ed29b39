"""Gradient accumulation in Keras 3 `model.fit` on the JAX backend
(`optimizer(..., gradient_accumulation_steps=K)`), recorded by
accumcheck_jax's KerasRecorder and judged by `accumcheck certify --contract`.

    KERAS_BACKEND=jax python examples/jax/train_keras.py --case fit --out trace/
    accumcheck certify --contract --trace trace/

(KERAS_BACKEND=torch records Keras's torch backend the same way.)

A small MLP classifier on seeded synthetic data, fit with batch_size 4
(sum_loss: 8; or --batch), K = 4, 2 epochs, Keras's default loss reduction
(the batch mean); the cases (--case):
  fit        correct: 48 samples (every window of 4 equal batches), Adam
  adamw      fit with AdamW(weight_decay=0.1): the decay is the update's
             (Keras releases before 3.5 also decayed on every micro-step)
  adamw_micro  adamw with AdamW's decoupled weight decay also applied on
             the micro-steps that only accumulate, as Keras before 3.5.0
             ran it (keras #19990): optimizer-state-every-micro-step
  uneven     46 samples: the epoch's last batch has 2 samples, weighed as
             the others (Keras averages its K batch means)
  leftover   44 samples: 11 batches per epoch, and the optimizer's window
             counter runs across the epoch's end
  sum_loss   the loss with reduction="sum": each batch's summed loss, / K;
             64 samples in batches of 8 (B != K): every sample weighs
             1/K = 8/N_w (summed-loss-divided-by-k; at B = K that is 1/B,
             no-loss-normalization's weight, and the two cannot be told apart)
  schedule   an ExponentialDecay lr schedule (halved every 2 optimizer
             steps): Keras evaluates it at its micro-batch counter
  dropout    fit, the model with BatchNormalization and Dropout (random
             masks, running statistics: the recorder must not move them)
  l2         fit, the hidden layer with kernel_regularizer=L2(0.01): Keras's
             loss adds the penalty, which reaches the parameters directly,
             not through the model's outputs (the recorder's output path
             must see that and take the full path)
  l2_share   l2, recorded with a summed loss that carries each item's share
             of the penalty (summed_with_penalty): the loss Keras
             differentiates, so the premise holds on the output path: PASS
--no-record fits the same without the recorder (the bit-identity test and
the bench compare the two); --identity PATH fits without the recorder
first, then as asked, in this process, and writes both runs' weight
digests to PATH.rank0 (bench/conformance.py compares them).
"""

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import keras  # noqa: E402
from accumcheck_jax import Refused, exit_on_refusal  # noqa: E402

CASES = ("fit", "adamw", "adamw_micro", "uneven", "leftover", "sum_loss", "schedule", "dropout", "l2",
         "l2_share")
SAMPLES = {"fit": 48, "adamw": 48, "adamw_micro": 48, "uneven": 46, "leftover": 44, "sum_loss": 64, "schedule": 48,
           "dropout": 48, "l2": 48, "l2_share": 48}
# batch_size per case (4 unless here): sum_loss's batches differ from K.
BATCH = {"sum_loss": 8}


def data(samples, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    w = rng.standard_normal((features, classes)).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.standard_normal((samples, classes)), axis=1).astype(np.int32)
    return x, y


def summed_loss(y_true, y_pred, sample_weight=None):
    """The SUM of the batch's item losses (keras.ops: the recorder's float64
    calibration runs it on a float64 clone of the model)."""
    losses = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
    if sample_weight is not None:
        losses = losses * sample_weight
    return keras.ops.sum(losses)


def summed_with_penalty(model):
    """summed_loss plus each item's share of the model's penalties (its
    losses, a kernel_regularizer's): Keras's default reduction
    differentiates the batch mean plus the penalties, so the SUM of the
    item losses it weighs is this (the recorder reads model.losses at the
    weights its gradient is taken at)."""
    ops = keras.ops

    def summed(y_true, y_pred, sample_weight=None):
        n = ops.cast(ops.shape(y_pred)[0], y_pred.dtype)
        share = ops.cast(ops.sum(ops.stack(model.losses)), y_pred.dtype)
        return summed_loss(y_true, y_pred, sample_weight) + n * share
    return summed


def micro_step_adamw():
    """AdamW as Keras before 3.5.0 ran it with gradient_accumulation_steps
    (keras issue #19990, fixed by PR #19998): the decoupled weight decay
    p -= lr * wd * p applied on every call, the micro-steps that only
    accumulate included (the update call decays once, as Keras does)."""
    ops = keras.ops

    class MicroStepAdamW(keras.optimizers.AdamW):
        def apply(self, grads, trainable_variables=None):
            if self.built:
                calls = getattr(self, "_iterations", None)
                calls = self.iterations if calls is None else calls
                update = ops.equal((calls + 1) % self.gradient_accumulation_steps, 0)
                for v in (trainable_variables or self._trainable_variables):
                    if self._use_weight_decay(v):
                        lr = ops.cast(self.learning_rate, v.dtype)
                        wd = ops.cast(self.weight_decay, v.dtype)
                        v.assign(ops.where(update, v.value, v.value - v.value * wd * lr))
            return super().apply(grads, trainable_variables)
    return MicroStepAdamW


def build(args):
    keras.utils.set_random_seed(args.seed)
    if args.case == "dropout":
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(args.hidden),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Activation("tanh"), keras.layers.Dropout(0.3),
                                  keras.layers.Dense(4)])
    else:
        penalty = keras.regularizers.L2(0.01) if args.case in ("l2", "l2_share") else None
        model = keras.Sequential([keras.Input((8,)),
                                  keras.layers.Dense(args.hidden, activation="tanh",
                                                     kernel_regularizer=penalty),
                                  keras.layers.Dense(4)])
    lr = args.lr
    if args.case == "schedule":
        # The lr halved every 2 optimizer steps (Keras's ExponentialDecay,
        # staircase), as certify's `step` schedule (step_size 2, gamma 0.5).
        lr = keras.optimizers.schedules.ExponentialDecay(args.lr, decay_steps=2, decay_rate=0.5,
                                                         staircase=True)
    if args.case in ("adamw", "adamw_micro"):
        cls = micro_step_adamw() if args.case == "adamw_micro" else keras.optimizers.AdamW
        opt = cls(lr, weight_decay=0.1, gradient_accumulation_steps=args.K)
    else:
        opt = keras.optimizers.Adam(lr, gradient_accumulation_steps=args.K)
    reduction = "sum" if args.case == "sum_loss" else "sum_over_batch_size"
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=reduction))
    return model


def run(args):
    samples = args.samples or SAMPLES[args.case]
    x, y = data(samples, 8, 4)
    model = build(args)
    callbacks = []
    if args.record:
        from accumcheck_jax import KerasRecorder
        schedule = {"kind": "step", "step_size": 2, "gamma": 0.5} \
            if args.case == "schedule" else None
        loss = summed_with_penalty(model) if args.case == "l2_share" else summed_loss
        callbacks.append(KerasRecorder(model, loss, out=args.out, lr=args.lr,
                                       schedule=schedule, quiet=args.quiet))
    batch = args.batch or BATCH.get(args.case, 4)
    model.fit(x, y, batch_size=batch, epochs=args.epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    return [keras.ops.convert_to_numpy(v.value) for v in model.trainable_variables]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="fit", help="one of: " + ", ".join(CASES))
    p.add_argument("--K", type=int, default=4)
    p.add_argument("--batch", type=int, default=0, help="default: the case's (4; sum_loss: 8)")
    p.add_argument("--samples", type=int, default=0, help="default: the case's")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--hidden", type=int, default=16, help="the hidden layer's width")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="trace")
    p.add_argument("--no-record", dest="record", action="store_false")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--identity", metavar="PATH",
                   help="the fit without the recorder first, then as asked, in this process: "
                   "both runs' weight digests to PATH.rank0")
    args = p.parse_args(argv)
    if args.case not in CASES:
        raise Refused("--case: expected one of %s, got %r" % (", ".join(CASES), args.case))
    if args.K < 2 or args.batch < 0 or args.samples < 0 or args.epochs < 1 or args.hidden < 1:
        raise Refused("--K must be >= 2 (Keras's gradient_accumulation_steps), --epochs "
                      "and --hidden >= 1, --batch (0: the case's) and --samples >= 0")
    if keras.backend.backend() not in ("jax", "torch"):
        raise Refused("KERAS_BACKEND=jax or torch: the recorder records Keras's JAX and torch "
                      "backends (this process runs %r)" % keras.backend.backend())
    if args.identity:
        import _digest
        plain = _digest.digest(run(argparse.Namespace(**dict(vars(args), record=False))))
        trained = run(args)
        with open(args.identity + ".rank0", "w") as f:
            f.write(f"plain {plain}\nrecorded {_digest.digest(trained)}\n")
        return trained
    return run(args)


if __name__ == "__main__":
    exit_on_refusal(main)
