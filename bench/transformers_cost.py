#!/usr/bin/env python3
"""What recording costs on Transformers' Trainer: trainer.train()'s CPU
time (time.process_time, inside the case's own process, least of --runs)
with AccumcheckCallback and without it, on a conformance case, in the
framework's venv (bench/conformance.py venv).  The bound (issue 33):
recording costs at most 3x the framework's own run.

    bench/transformers_cost.py [--spec transformers==5.24.0] [--case sgd] [--runs 5]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import conformance  # noqa: E402


def one(py, case, record, env):
    with tempfile.TemporaryDirectory() as out:
        argv = [py, os.path.join(conformance.CASES, "transformers_%s.py" % case), "--out", out]
        p = subprocess.run(argv + ([] if record else ["--no-record"]), capture_output=True,
                           text=True, env=env)
        if p.returncode != 0:
            sys.exit("%s failed:\n%s" % (" ".join(argv), p.stderr[-2000:]))
        m = re.findall(r"trainer.train: ([0-9.]+) s CPU", p.stderr)
        return min(float(x) for x in m)  # one per rank: the least loaded


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", default="transformers==5.24.0")
    ap.add_argument("--case", default="sgd")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    py, _, err = conformance.venv(conformance.row_of(a.spec), quiet=True)
    if err:
        sys.exit(err)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                       conformance.CASES]),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    plain, recorded = [], []
    for _ in range(a.runs):  # alternating, so machine load hits both alike
        plain.append(one(py, a.case, False, env))
        recorded.append(one(py, a.case, True, env))
    ratio = min(recorded) / min(plain)
    print("%s %s: trainer.train %.3f s CPU without the callback, %.3f s with it (least of %d): "
          "%.2fx %s" % (a.spec, a.case, min(plain), min(recorded), a.runs, ratio,
                        "(within 3x)" if ratio <= 3 else "(OVER the 3x bound)"))
    return 0 if ratio <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
