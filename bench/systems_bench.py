"""The contract tier's recording cost on the memory systems (issue 34:
<= 3x the system's own run): each examples/systems trainer run plain
(--no-record) and recorded, alternately, REPEATS times each, as the
processes CTest runs (its ranks spawned; the CPU time of all of them,
from getrusage of the children, so process start and `import torch` are
in both); the least of each, and their ratio.

    PYTHONPATH=python python3 bench/systems_bench.py [--repeats 3] [--cases NAME,...]"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
systems = os.path.join(here, "..", "examples", "systems")
CASES = {
    "checkpointing.reentrant": ["checkpointing.py", "--reentrant"],
    "checkpointing.ddp.reentrant": ["checkpointing.py", "--ddp", "--reentrant", "--samples", "48",
                                    "--spawn", "2"],
    "fsdp2.correct": ["fsdp.py", "--spawn", "2"],
    "fsdp2.clip_local_norm": ["fsdp.py", "--spawn", "2", "--loop", "clip_local_norm"],
    "fsdp1.correct": ["fsdp.py", "--fsdp1", "--spawn", "2"],
    "fsdp1.clip_local_norm": ["fsdp.py", "--fsdp1", "--spawn", "2", "--loop", "clip_local_norm"],
    "pipeline.gpipe.correct": ["pipeline.py", "--schedule", "gpipe", "--spawn", "2"],
    "pipeline.1f1b.correct": ["pipeline.py", "--schedule", "1f1b", "--spawn", "2"],
}


def cpu_of(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    for name in a.cases.split(","):
        script, *args = CASES[name]
        plain, recorded = [], []
        with tempfile.TemporaryDirectory() as tmp:
            base = [sys.executable, os.path.join(systems, script), "--out", tmp] + args
            for _ in range(a.repeats):
                plain.append(cpu_of(base + ["--no-record"]))
                recorded.append(cpu_of(base))
        print("%-30s plain %6.2f s CPU  recorded %6.2f s CPU  ratio %.2f (least of %d)"
              % (name, min(plain), min(recorded), min(recorded) / min(plain), a.repeats), flush=True)


if __name__ == "__main__":
    main()
