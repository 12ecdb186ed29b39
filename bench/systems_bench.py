"""The contract tier's recording cost on the memory systems (issue 34:
recording costs at most 3x the system's own run, CPU time, the least of
several runs): each examples/systems trainer run plain (--no-record) and
recorded, alternately, REPEATS times each, with one intra-op thread a
process (OMP_NUM_THREADS=1, as deepspeed_train.py sets); the least of
each, and their ratio.

What is timed (the method bench/deepspeed_bench.py uses): each rank's CPU
seconds in its training loop, the model, data and optimizer already built,
the recorder's construction, its hooks, recomputes and collectives and its
close() (the trace written) included: the largest rank's, as the trainer
prints it ("rank R: S s cpu in the loop").  --process instead times every
process of the run (getrusage of the children: process start and `import
torch` in both, which dominate these small runs).

    PYTHONPATH=python python3 bench/systems_bench.py [--repeats 5] [--cases NAME,...] [--process]
    PYTHONPATH=python python3 bench/systems_bench.py --identity [--cases NAME,...]

--identity: no timing; each case once with the trainer's --identity (its
run without the recorder, then with it, in one process,
examples/contract/identity.py): whether every rank's trained parameters
are the same bits (the systems cases CTest does not compare: their plain
reruns cost CI seconds).  Exits 1 when any differ."""

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
systems = os.path.join(here, "..", "examples", "systems")
CASES = {
    "checkpointing.non_reentrant": ["checkpointing.py"],
    "checkpointing.reentrant": ["checkpointing.py", "--reentrant"],
    # 4 x the samples (24 micro-batches, 8 steps): the recorder's fixed
    # cost (its copies, the trace) spread over more steps.
    "checkpointing.reentrant.samples96": ["checkpointing.py", "--reentrant", "--samples", "96"],
    "checkpointing.ddp.reentrant": ["checkpointing.py", "--ddp", "--reentrant", "--samples", "48",
                                    "--spawn", "2"],
    "checkpointing.ddp.non_reentrant": ["checkpointing.py", "--ddp", "--samples", "48",
                                        "--spawn", "2"],
    "checkpointing.no_preserve_rng": ["checkpointing.py", "--no-preserve-rng"],
    # 4 x the samples under DDP (24 micro-batches a rank, 8 steps).
    "checkpointing.ddp.reentrant.samples192": ["checkpointing.py", "--ddp", "--reentrant",
                                               "--samples", "192", "--spawn", "2"],
    "checkpointing.ddp.non_reentrant.samples192": ["checkpointing.py", "--ddp", "--samples", "192",
                                                   "--spawn", "2"],
    "fsdp2.correct": ["fsdp.py", "--spawn", "2"],
    "fsdp2.clip_local_norm": ["fsdp.py", "--spawn", "2", "--loop", "clip_local_norm"],
    "fsdp1.correct": ["fsdp.py", "--fsdp1", "--spawn", "2"],
    "fsdp1.clip_local_norm": ["fsdp.py", "--fsdp1", "--spawn", "2", "--loop", "clip_local_norm"],
    "fsdp1.flat_hook": ["fsdp.py", "--fsdp1", "--spawn", "2", "--loop", "flat_hook"],
    # Each rank leaves out one batch it drew: the ranks agree on the
    # forwards they calibrate (FAIL weights, micro-batches skipped).
    "fsdp2.rank_skips": ["fsdp.py", "--spawn", "2", "--loop", "rank_skips"],
    "fsdp1.rank_skips": ["fsdp.py", "--fsdp1", "--spawn", "2", "--loop", "rank_skips"],
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32): PASS.
    "fsdp2.mp_bf16": ["fsdp.py", "--spawn", "2", "--mp"],
    "fsdp2.sync_every_micro_step": ["fsdp.py", "--spawn", "2", "--loop", "sync_every_micro_step"],
    "fsdp2.no_sync_at_boundary": ["fsdp.py", "--spawn", "2", "--loop", "no_sync_at_boundary"],
    "pipeline.gpipe.correct": ["pipeline.py", "--schedule", "gpipe", "--spawn", "2"],
    "pipeline.1f1b.correct": ["pipeline.py", "--schedule", "1f1b", "--spawn", "2"],
    "pipeline.gpipe.scale_grads": ["pipeline.py", "--schedule", "gpipe", "--loop", "scale_grads",
                                   "--spawn", "2"],
    "pipeline.1f1b.per_step_mean": ["pipeline.py", "--schedule", "1f1b", "--loop", "per_step_mean",
                                    "--spawn", "2"],
    "pipeline.gpipe.boundary": ["pipeline.py", "--schedule", "gpipe", "--loop", "boundary",
                                "--spawn", "2"],
    "pipeline.1f1b.no_scale": ["pipeline.py", "--schedule", "1f1b", "--loop", "no_scale",
                               "--spawn", "2"],
    # Three stages (the premise check's gradient through the middle one),
    # and a 4.2M-parameter MLP (the recorder's memory beside the model's).
    "pipeline.1f1b.3stages": ["pipeline.py", "--schedule", "1f1b", "--n", "3", "--spawn", "3"],
    "pipeline.gpipe.width2048": ["pipeline.py", "--schedule", "gpipe", "--width", "2048",
                                 "--spawn", "2"],
    "pipeline.1f1b.width2048": ["pipeline.py", "--schedule", "1f1b", "--width", "2048",
                                "--spawn", "2"],
}


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1")


def loop_cpu(argv):
    """The largest rank's CPU seconds in the loop of one run of argv (a
    trainer that prints "rank R: S s cpu in the loop")."""
    r = subprocess.run(argv, capture_output=True, text=True, env=_env())
    if r.returncode != 0:
        raise SystemExit("%s exited %d:\n%s" % (" ".join(argv), r.returncode, r.stdout + r.stderr))
    found = re.findall(r"rank \d+: ([0-9.]+) s cpu in the loop", r.stdout)
    if not found:
        raise SystemExit("%s printed no loop time:\n%s" % (" ".join(argv), r.stdout + r.stderr))
    return max(float(t) for t in found)


def process_cpu(argv):
    """The CPU seconds of every process of one run of argv."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, capture_output=True, env=_env())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def identical(name, argv, tmp):
    """Runs argv with --identity: True when every rank's digests of the
    plain and the recorded run agree (printed)."""
    path = os.path.join(tmp, "identity")
    r = subprocess.run(argv + ["--identity", path, "--quiet"], capture_output=True, text=True,
                       env=_env())
    ranks = sorted(f for f in os.listdir(tmp) if f.startswith("identity.rank"))
    runs = [dict(line.split() for line in open(os.path.join(tmp, f)).read().splitlines())
            for f in ranks]
    same = r.returncode == 0 and bool(runs) and all(d.get("plain") == d.get("recorded")
                                                   for d in runs)
    print("%-40s %s (%d rank%s%s)" % (name, "bit-identical" if same else "DIFFERS", len(runs),
                                      "" if len(runs) == 1 else "s",
                                      "" if r.returncode == 0 else ", exit %d: %s"
                                      % (r.returncode, (r.stderr.strip().splitlines() or [""])[-1])),
          flush=True)
    return same


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--process", action="store_true",
                    help="time every process of the run, not the loop")
    ap.add_argument("--identity", action="store_true",
                    help="no timing: whether each case's trained parameters are the same bits "
                    "with and without the recorder")
    a = ap.parse_args()
    if a.identity:
        bad = 0
        for name in a.cases.split(","):
            script, *args = CASES[name]
            with tempfile.TemporaryDirectory() as tmp:
                bad += not identical(name, [sys.executable, os.path.join(systems, script), "--out",
                                            os.path.join(tmp, "trace")] + args, tmp)
        return 1 if bad else 0
    measure = process_cpu if a.process else loop_cpu
    for name in a.cases.split(","):
        script, *args = CASES[name]
        plain, recorded = [], []
        with tempfile.TemporaryDirectory() as tmp:
            base = [sys.executable, os.path.join(systems, script), "--out", tmp] + args
            for _ in range(a.repeats):
                plain.append(measure(base + ["--no-record"]))
                recorded.append(measure(base))
        print("%-32s plain %7.3f s CPU  recorded %7.3f s CPU  ratio %.2f (least of %d%s)"
              % (name, min(plain), min(recorded), min(recorded) / min(plain), a.repeats,
                 ", every process" if a.process else ", the loop"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
