"""Recording cost under DeepSpeed (issue 34: at most 3x the system's own
run): examples/systems/deepspeed_train.py with and without the recorder,
each rank's CPU time in its training loop (the engine built, the loop and
the recorder's close), the least of --repeat runs, per ZeRO stage.

    DS_ACCELERATOR=cpu PYTHONPATH=python .venv-deepspeed/bin/python \\
        bench/deepspeed_bench.py --stages 0 2 --repeat 3
"""
import argparse
import os
import sys
import tempfile

import systems_bench

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "systems", "deepspeed_train.py")


def loop_cpu(stage, record, extra):
    """The largest rank's loop CPU seconds of one 2-rank run."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, TRAIN, "--out", out, "--stage", str(stage), "--spawn", "2"] + extra
        if not record:
            argv.append("--no-record")
        return systems_bench.loop_cpu(argv)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--offload", action="store_true")
    a = ap.parse_args()
    extra = ["--offload", "--torch-adam"] if a.offload else []
    for stage in a.stages:
        plain = min(loop_cpu(stage, False, extra) for _ in range(a.repeat))
        recorded = min(loop_cpu(stage, True, extra) for _ in range(a.repeat))
        print("ZeRO stage %d%s: %.3f s cpu recorded, %.3f s not recorded: %.2fx (least of %d)"
              % (stage, " + offload" if a.offload else "", recorded, plain, recorded / plain, a.repeat))


if __name__ == "__main__":
    main()
