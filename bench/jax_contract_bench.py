"""What recording costs a JAX run (issue 46): examples/jax/train_optax.py's
loops, each run in this process with and without accumcheck_jax's
ContractRecorder, the least CPU time (this process, all its threads) of
several runs each, compilation included (the recorder's programs are
compiled in the run they record), the plain and recorded runs of a row
in turns.  Three models: the example's tiny MLP
(8-16-4, 212 parameters), a wide one (512-4096-4: 2.1M parameters) and a
large one (1024-10240-4: 10.5M parameters; 1024 samples, 64 micro-batches of
16: a run long enough that the recorder's compilations are not most of it),
at K = 4 and 16.  Two ways of
recording (--paths): "apply", the forward wrapped by rec.apply (g_j read
from your own backward at its outputs; Flax NNX's model call wrapped the
same way), and "full", without it (train_optax.py
--no-apply: g_j a second gradient of the recorder's).  The recorder's
budget is 1.5x the plain run; every run of a row must train the same
parameters, bit for bit (train_optax.digest).  Each row also gives the
CPU time after the run's first optimizer step (train_optax's mark), its
end and the recorder's close() included: the steady state a long run
tends to, its compilations left out (as bench/recorder_scale.py times
PyTorch's steps after an untimed one).  The current numbers:
docs/frameworks-jax-keras.md, "What recording costs".

    .venv-jax/bin/python bench/jax_contract_bench.py [--repeats 3] [--loops hand,multisteps,nnx]
        [--models tiny,wide,large] [--K 4,16] [--scale 1,4] [--paths apply,full]
        [--batch 16] [--python DIR]

--python DIR measures the recorder of another checkout (accumcheck_jax
imported from DIR, e.g. an older commit's python/ from `git archive`), the
loops this checkout's: run it and this checkout's in turns, row by row, to
compare two recorders beside each other (the machine's speed drifts).
"""

import argparse
import os
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "python"), os.path.join(here, "..", "examples", "jax")]
if "--python" in sys.argv[:-1]:  # the recorder imported from there, before train_optax's own
    sys.path.insert(0, os.path.abspath(sys.argv[sys.argv.index("--python") + 1]))
    import accumcheck_jax  # noqa: E402,F401

import train_optax  # noqa: E402  (from examples/jax, put on the path above)

# name: (features, hidden, samples, epochs); micro-batches of --batch (16).
MODELS = {"tiny": (8, 16, 2048, 4), "wide": (512, 4096, 1024, 1),
          "large": (1024, 10240, 1024, 1)}


def least(argvs, repeats):
    """([(least CPU s, least wall s, least steady CPU s)] of `repeats` runs
    of each argv, run in turns (plain, recorded, plain, ...): the machine's
    drift and the other processes' load fall on both alike; and whether
    every run trained the same parameters, bit for bit (recording never
    changes the run)).  The steady CPU time is the run's after its first
    optimizer step (train_optax's mark: the compilations before it), to
    its end (the recorder's close() included)."""
    import jax
    cpu, wall, steady = ([float("inf")] * len(argvs) for _ in range(3))
    digests = set()
    for _ in range(repeats):
        for i, argv in enumerate(argvs):
            marked = []

            def mark(params):
                jax.block_until_ready(params)
                marked.append(time.process_time())

            c, t = time.process_time(), time.perf_counter()
            trained = train_optax.main(argv, mark)
            end = time.process_time()
            cpu[i], wall[i] = min(cpu[i], end - c), min(wall[i], time.perf_counter() - t)
            steady[i] = min(steady[i], end - marked[0])
            digests.add(train_optax.digest(trained))
    return list(zip(cpu, wall, steady)), len(digests) == 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loops", default="hand,multisteps,nnx")
    p.add_argument("--models", default="tiny,wide,large")
    p.add_argument("--paths", default="apply,full")
    p.add_argument("--K", default="4,16")
    p.add_argument("--scale", default="1",
                   help="run lengths: the model's epochs times each (e.g. 1,4: the curve of "
                        "the recorder's fixed cost against its cost per micro-batch)")
    p.add_argument("--python", help="the recorder measured: accumcheck_jax imported from DIR")
    p.add_argument("--batch", type=int, default=16,
                   help="samples a micro-batch (the model's samples scaled with it: the same "
                        "micro-batches a run)")
    args = p.parse_args()
    import accumcheck_jax
    print("recorder: %s" % os.path.dirname(os.path.dirname(
        os.path.abspath(accumcheck_jax.__file__))))
    print("load average: %.2f %.2f %.2f" % os.getloadavg())
    worst, worst_steady, changed = 0.0, 0.0, 0
    print("| model | loop | path | K | micro-batches | plain CPU s | recorded CPU s | ratio "
          "| after the first step: plain / recorded CPU s | ratio | plain wall s | recorded wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            features, hidden, samples, epochs = MODELS[model]
            samples = samples * args.batch // 16
            for K, scale in [(k, int(x)) for x in args.scale.split(",") for k in args.K.split(",")]:
                for loop in args.loops.split(","):
                    common = ["--loop", loop, "--samples", str(samples), "--sizes", str(args.batch),
                              "--epochs", str(epochs * scale), "--K", K, "--features", str(features),
                              "--hidden", str(hidden), "--quiet"]
                    paths = args.paths.split(",")
                    runs, same = least([common + ["--no-record"]] + [
                        common + ([] if path == "apply" else ["--no-apply"])
                        + ["--out", os.path.join(tmp, loop)] for path in paths], args.repeats)
                    plain = runs[0]
                    changed += not same
                    for path, recorded in zip(paths, runs[1:]):
                        ratio = recorded[0] / plain[0]
                        worst = max(worst, ratio)
                        worst_steady = max(worst_steady, recorded[2] / plain[2])
                        print("| %s | %s | %s | %s | %d | %.3f | %.3f | %.2fx | %.3f / %.3f | %.2fx "
                              "| %.3f | %.3f |"
                              % (model, loop, path, K, samples // args.batch * epochs * scale, plain[0],
                                 recorded[0], ratio, plain[2], recorded[2], recorded[2] / plain[2],
                                 plain[1], recorded[1]),
                              flush=True)
    print("load average: %.2f %.2f %.2f" % os.getloadavg())
    print("worst %.2fx of the plain run's CPU time (budget 1.5x); after the first step %.2fx"
          % (worst, worst_steady))
    print("trained parameters bit-identical with and without the recorder: %s"
          % ("every row" if not changed else "NO, in %d rows" % changed))
    return 0 if worst <= 1.5 and not changed else 1


if __name__ == "__main__":
    sys.exit(main())
