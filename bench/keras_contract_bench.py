"""What recording costs a Keras 3 fit (issue 46): a fit run in this
process with and without accumcheck_jax's KerasRecorder, interleaved
(plain, recorded, plain, ...: a shared machine's load moves both alike),
the least CPU time (this process's, all threads) and the least wall time
of several runs each, compilation included (every fit builds its model
anew, so Keras compiles its train step each time, and the recorder its
programs).  The recorder's budget is 1.5x the plain run.  Every case of
train_keras.py is first fitted with and without the recorder (its own
sizes) and the trained weights must be bit-identical (exit 1 otherwise):
the unit tests keep to one case, this checks them all, on the backend
KERAS_BACKEND names; each timed model's first pair is compared too.

    KERAS_BACKEND=jax .venv-jax/bin/python bench/keras_contract_bench.py [--repeats 5]
        [--samples 2048] [--batch 16] [--hidden 16,256] [--epochs 2]
    # the compute-bound model (3 Dense layers, features -> width -> width -> 10):
    KERAS_BACKEND=jax .venv-jax/bin/python bench/keras_contract_bench.py --model mlp3 \
        --features 512 --width 1024 --batch 64 --samples 4096 --epochs 1 --repeats 3
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "python"), os.path.join(here, "..", "examples", "jax")]

import numpy as np  # noqa: E402
import train_keras  # noqa: E402


def bit_identical(tmp):
    """Every case fitted with and without the recorder: the same bits."""
    ok = True
    for case in train_keras.CASES:
        a = train_keras.main(["--case", case, "--no-record", "--quiet"])
        b = train_keras.main(["--case", case, "--out", os.path.join(tmp, "bits-" + case),
                              "--quiet"])
        same = len(a) == len(b) and all(
            x.dtype == y.dtype and np.array_equal(x.view(np.uint32), y.view(np.uint32))
            for x, y in zip(a, b))
        print("%-9s weights with and without the recorder: %s"
              % (case, "bit-identical" if same else "DIFFERENT"), flush=True)
        ok = ok and same
    return ok


def same(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and np.array_equal(x.view(np.uint32), y.view(np.uint32))
        for x, y in zip(a, b))


def timed(fn):
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - t, out


def mlp3(args, out, marked=None):
    """The compute-bound model: Dense(width, tanh), Dense(width, tanh),
    Dense(10) on `features` inputs, Adam(1e-3, gradient_accumulation_steps=K),
    the example's loss; out: the trace folder, or None (not recorded);
    marked: a list the CPU time is appended to once the first window's
    optimizer step is done (a callback after the recorder's, in both
    runs)."""
    import keras
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, args.features)).astype(np.float32)
    y = rng.integers(0, 10, args.samples).astype(np.int32)
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((args.features,)),
                          keras.layers.Dense(args.width, activation="tanh"),
                          keras.layers.Dense(args.width, activation="tanh"),
                          keras.layers.Dense(10)])
    m.compile(optimizer=keras.optimizers.Adam(1e-3, gradient_accumulation_steps=args.K),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = []
    if out is not None:
        from accumcheck_jax import KerasRecorder
        cb.append(KerasRecorder(m, train_keras.summed_loss, out=out, quiet=True))
    if marked is not None:
        cb.append(_Mark(keras, args.K, marked))
    m.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=False, verbose=0,
          callbacks=cb)
    return [keras.ops.convert_to_numpy(v.value) for v in m.trainable_variables]


def _Mark(keras, K, marked):
    """A callback that notes the CPU time at the end of the K-th batch (the
    first optimizer step: the fit's compilations before it), its weights
    computed."""
    class Mark(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == K - 1 and not marked:
                for v in self.model.trainable_variables:
                    keras.ops.convert_to_numpy(v.value)
                marked.append(time.process_time())
    return Mark()


def side_by_side(plain, recorded, repeats):
    """plain() and recorded() interleaved, repeats times: the least CPU
    and wall time of each and the least CPU time after the first
    optimizer step (where the run marks it: else None), and whether the
    first pair's weights agree."""
    p = [float("inf")] * 3
    r = [float("inf")] * 3
    bits = None
    for i in range(repeats):
        pm, rm = [], []
        pc, pw, a = timed(lambda: plain(pm))
        pe = time.process_time()
        rc, rw, b = timed(lambda: recorded(rm))
        re_ = time.process_time()
        p = [min(p[0], pc), min(p[1], pw), min(p[2], pe - pm[0]) if pm else None]
        r = [min(r[0], rc), min(r[1], rw), min(r[2], re_ - rm[0]) if rm else None]
        if i == 0:
            bits = same(a, b)
    return p, r, bits


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", choices=("example", "mlp3"), default="example",
                   help="example: train_keras.py's MLP (--hidden); mlp3: the compute-bound one")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--hidden", default="16,256")
    p.add_argument("--features", type=int, default=512, help="mlp3's inputs")
    p.add_argument("--width", type=int, default=1024, help="mlp3's hidden width")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--K", type=int, default=4)
    p.add_argument("--skip-cases", action="store_true",
                   help="skip the bit-identity check of every train_keras.py case")
    args = p.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_cases and not bit_identical(tmp):
            return 1
        if args.model == "mlp3":
            runs = [("mlp3 %dx%dx%dx10 batch %d" % (args.features, args.width, args.width,
                                                    args.batch),
                     lambda m: mlp3(args, None, m),
                     lambda m: mlp3(args, os.path.join(tmp, "mlp3"), m))]
        else:
            runs = []
            for hidden in args.hidden.split(","):
                common = ["--case", "fit", "--samples", str(args.samples), "--batch",
                          str(args.batch), "--hidden", hidden, "--epochs", str(args.epochs),
                          "--K", str(args.K), "--quiet"]
                runs.append(("hidden %-5s" % hidden,
                             lambda m, c=common: train_keras.main(c + ["--no-record"]),
                             lambda m, c=common, h=hidden: train_keras.main(
                                 c + ["--out", os.path.join(tmp, h)])))
        for name, plain, recorded in runs:
            (pc, pw, ps), (rc, rw, rs), bits = side_by_side(plain, recorded, args.repeats)
            worst = max(worst, rc / pc)
            steady = "" if ps is None else "; after the first step %.3f / %.3f s CPU, %.2fx" % (
                ps, rs, rs / ps)
            print("%s plain %.3f s CPU (%.3f s wall)  recorded %.3f s CPU (%.3f s wall)  "
                  "%.2fx CPU, %.2fx wall%s  (least of %d, interleaved; load %.2f; weights %s)"
                  % (name, pc, pw, rc, rw, rc / pc, rw / pw, steady, args.repeats,
                     os.getloadavg()[0], "bit-identical" if bits else "DIFFERENT"), flush=True)
            if not bits:
                return 1
    print("worst %.2fx CPU (budget 1.5x)" % worst)
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
