"""The Accelerate and Lightning integrations' recording cost: CPU time of a
framework case (tests/frameworks/<case>.py) with and without its
integration, least of several runs, in one process (the framework and
torch imported once before any timing, so the import is in neither).

    PYTHONPATH=python FRAMEWORK_VENV/bin/python bench/frameworks_record_cost.py \\
        [--runs 3] accelerate_lm:mean lightning_classifier:sgd ...

Prints per case: the least CPU seconds without and with recording and
their ratio (issue 33: at most 3x)."""

import argparse
import importlib
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "frameworks"))


def cpu(fn):
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("cases", nargs="+", help="CASE:VARIANT, e.g. accelerate_lm:mean")
    a = ap.parse_args()
    import logging
    logging.disable(logging.WARNING)
    for cv in a.cases:
        name, variant = cv.split(":")
        case = importlib.import_module(name)
        plain, recorded = [], []
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "trace")
            case.main(["--out", out, "--variant", variant, "--no-record"])  # warm-up
            for _ in range(a.runs):
                plain.append(cpu(lambda: case.main(["--out", out, "--variant", variant,
                                                    "--no-record"])))
                recorded.append(cpu(lambda: case.main(["--out", out, "--variant", variant])))
        p, r = min(plain), min(recorded)
        print("%-36s %.3f s cpu without, %.3f s with: %.2fx" % (cv, p, r, r / p), flush=True)


if __name__ == "__main__":
    main()
