"""What recording costs a Keras 3 fit (issue 46): examples/jax/
train_keras.py's correct fit (Adam, gradient_accumulation_steps=K), run in
this process with and without accumcheck_jax's KerasRecorder, the least
CPU time (this process's, all threads) and the least wall time of several
runs each, compilation included (every fit builds its model anew, so
Keras compiles its train step each time, and the recorder its program).
The recorder's budget is 1.5x the plain run.  Every case of
train_keras.py is first fitted with and without the recorder (its own
sizes) and the trained weights must be bit-identical (exit 1 otherwise):
the unit tests keep to one case, this checks them all, on the backend
KERAS_BACKEND names.

    KERAS_BACKEND=jax .venv-jax/bin/python bench/keras_contract_bench.py [--repeats 5]
        [--samples 2048] [--batch 16] [--hidden 16,256] [--epochs 2]
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


def least(argv, repeats):
    cpu = wall = float("inf")
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        train_keras.main(argv)
        cpu = min(cpu, time.process_time() - c)
        wall = min(wall, time.perf_counter() - t)
    return cpu, wall


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--hidden", default="16,256")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--K", type=int, default=4)
    args = p.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        if not bit_identical(tmp):
            return 1
        for hidden in args.hidden.split(","):
            common = ["--case", "fit", "--samples", str(args.samples), "--batch", str(args.batch),
                      "--hidden", hidden, "--epochs", str(args.epochs), "--K", str(args.K),
                      "--quiet"]
            pc, pw = least(common + ["--no-record"], args.repeats)
            rc, rw = least(common + ["--out", os.path.join(tmp, hidden)], args.repeats)
            worst = max(worst, rc / pc)
            print("hidden %-5s plain %.3f s CPU (%.3f s wall)  recorded %.3f s CPU (%.3f s wall)"
                  "  %.2fx CPU, %.2fx wall" % (hidden, pc, pw, rc, rw, rc / pc, rw / pw),
                  flush=True)
    print("worst %.2fx CPU (budget 1.5x)" % worst)
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
