"""What recording costs a JAX run (issue 46): examples/jax/train_optax.py's
loops, each run in this process with and without accumcheck_jax's
ContractRecorder, the least wall time of several runs each (compilation
included: the recorder's callbacks are part of the programs it compiles).
The recorder's budget is 1.5x the plain run.

    .venv-jax/bin/python bench/jax_contract_bench.py [--repeats 5] [--loops hand,multisteps,nnx]
"""

import argparse
import os
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "python"), os.path.join(here, "..", "examples", "jax")]

import train_optax


def least(argv, repeats):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        train_optax.main(argv)
        best = min(best, time.perf_counter() - t)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loops", default="hand,multisteps,nnx")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--sizes", default="16")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for loop in args.loops.split(","):
            common = ["--loop", loop, "--samples", str(args.samples), "--sizes", args.sizes,
                      "--epochs", str(args.epochs), "--quiet"]
            plain = least(common + ["--no-record"], args.repeats)
            recorded = least(common + ["--out", os.path.join(tmp, loop)], args.repeats)
            worst = max(worst, recorded / plain)
            print("%-12s plain %.3f s  recorded %.3f s  %.2fx" % (loop, plain, recorded,
                                                                recorded / plain))
    print("worst %.2fx (budget 1.5x)" % worst)
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
