"""The contract tier's cost beside the trainer's own run (issue 11: <= 3x).

For each model and K: the same loop of examples/contract
(train.py), run plain and recorded by the ContractRecorder, alternately,
REPEATS times each in one process (after one warm-up run of each), then
`accumcheck certify --contract` on the last trace.  Reports the minimum and
the median of the loop's CPU time (time.process_time: this process's
threads, so other processes on a shared machine count less than in wall
time) and wall time, and the ratio (recorded + certify) / plain on the
minima (certify's CPU time from getrusage of the child).  One thread (torch.set_num_threads(1); run with
OPENBLAS_NUM_THREADS=1 so the BLAS does not spin a second thread).

    OPENBLAS_NUM_THREADS=1 python3 bench/contract_bench.py BUILD_DIR \\
        [--samples 168] [--repeats 5] [--cases gpt:transformers:4,...]"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples", "contract"))
import train  # noqa: E402

DEFAULT = "gpt:transformers:1,gpt:transformers:4,gpt:transformers:8,gpt:transformers:64," \
          "gpt:lightning:4,cnn:transformers:4"


def certify(tool, trace, *extra):
    """`accumcheck certify --contract` on a trace: (the finished process,
    its CPU seconds from getrusage of the children, its wall seconds)."""
    t0, u0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    c = subprocess.run([tool, "certify", "--contract", "--trace", trace, *extra],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c, (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime), wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--samples", type=int, default=168)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default=DEFAULT)
    a = ap.parse_args()
    tool = os.path.join(a.build, "cli", "accumcheck")
    out = tempfile.mkdtemp()
    print("%-22s %5s %5s | %-15s | %-15s | %-15s | %6s %6s" % (
        "model loop", "micro", "steps", "plain cpu (wall)", "rec. cpu (wall)", "cert cpu (wall)", "cpu x", "wall x"))
    for case in a.cases.split(","):
        model, loop, K = case.split(":")
        args = ["--model", model, "--loop", loop, "--K", K, "--samples", str(a.samples),
                "--quiet", "--out", os.path.join(out, "t")]
        plain_a, rec_a = train.parse(args + ["--no-record"]), train.parse(args)
        plain, rec = [], []
        train.run(plain_a)
        train.run(rec_a)
        for _ in range(a.repeats):
            plain.append(train.run(plain_a))
            rec.append(train.run(rec_a))
        c, cert_cpu, cert = certify(tool, os.path.join(out, "t"), "--quiet")
        rows = open(os.path.join(out, "t", "contract.csv")).read().splitlines()
        steps = sum(r.startswith("step,") for r in rows)
        micro = sum(r.startswith("micro,") for r in rows)
        pc, pw = min(x[1] for x in plain), min(x[0] for x in plain)
        rc, rw = min(x[1] for x in rec), min(x[0] for x in rec)
        print("%-22s %5d %5d | %6.3f (%6.3f) | %6.3f (%6.3f) | %6.3f (%6.3f) | %6.2f %6.2f   %s" % (
            "%s %s K=%s" % (model, loop, K), micro, steps, pc, pw, rc, rw, cert_cpu, cert,
            (rc + cert_cpu) / pc, (rw + cert) / pw, "exit %d" % c.returncode))
        print("%-22s %5s %5s | median %6.3f   | median %6.3f" % (
            "", "", "", statistics.median(x[1] for x in plain),
            statistics.median(x[1] for x in rec)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
