"""Runs one spawned multi-rank example N times and counts how its ranks end.

    python3 scripts/spawn_soak.py --case ddp --runs 100
    python3 scripts/spawn_soak.py --case fsdp --runs 100
    .venv-deepspeed/bin/python scripts/spawn_soak.py --case deepspeed --runs 100
    python3 scripts/spawn_soak.py --case ddp --runs 30 --cores   # keep a core and its stacks

Each run is the example's correct loop on 2 gloo ranks started by
torch.multiprocessing.spawn (ACCUMCHECK_START_METHOD=spawn, whatever the
environment says; --start-method fork for the comparison): fresh
interpreters that leave through the interpreter's own exit, C++ static
destructors included, as users who spawn get.  A run is

  clean   exit 0, the trace written (meta.csv, no rank marker left), no
          "terminate called" and no rank that exited on a signal;
  abort   a rank ended by SIGABRT: the launcher's "rank R exited with code
          -6", or "terminate called ..." on stderr (std::terminate);
  failed  anything else (an exit code, no trace, another signal).

Prints one line a run and a summary; exits 1 unless every run was clean.
With --cores each run works in its own folder with core dumps on (the
kernel's core_pattern must write a relative file name, `core` by default);
an aborted run's core is opened with gdb (`thread apply all bt`) and its
stacks kept in RUN/stacks.txt, with its output in RUN/output.txt.  Runs
one at a time (each a 2-rank run of a few seconds of CPU); run it under
`nice` on a shared machine.
"""

import argparse
import glob
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# case -> the example and its arguments (its correct loop, 2 ranks)
CASES = {
    "ddp": ["examples/contract/train_ddp.py", "--loop", "correct"],
    "fsdp": ["examples/systems/fsdp.py", "--loop", "correct", "--quiet"],
    "fsdp1": ["examples/systems/fsdp.py", "--fsdp1", "--loop", "correct", "--quiet"],
    "deepspeed": ["examples/systems/deepspeed_train.py", "--stage", "0", "--quiet"],
}


def classify(rc, output, trace):
    """(kind, why) of one run from its exit code, output and trace folder."""
    if "terminate called" in output or "exited with code -6" in output or rc == -6:
        line = next((ln for ln in output.splitlines() if "terminate called" in ln
                     or "exited with code -" in ln), "rc %d" % rc)
        return "abort", line.strip()
    signalled = [ln for ln in output.splitlines() if "exited with code -" in ln]
    if rc != 0 or signalled:
        return "failed", (signalled[0].strip() if signalled else "exit %d" % rc)
    if not os.path.isfile(os.path.join(trace, "meta.csv")):
        return "failed", "exit 0 but no trace (meta.csv) written"
    markers = glob.glob(os.path.join(trace, "rank*.incomplete"))
    if markers:
        return "failed", "exit 0 but rank markers left: %s" % ", ".join(
            sorted(os.path.basename(m) for m in markers))
    return "clean", ""


def stacks(python, core):
    """Every thread's stack in `core` (gdb, batch mode)."""
    gdb = shutil.which("gdb")
    if not gdb:
        return "no gdb on PATH: the core is kept at %s\n" % core
    out = subprocess.run([gdb, "-batch", "-nx", "-ex", "set pagination off",
                          "-ex", "info threads", "-ex", "thread apply all bt",
                          python, core], capture_output=True, text=True)
    return out.stdout + out.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--python", default=sys.executable,
                    help="the Python that runs the example (default: this one)")
    ap.add_argument("--work", default=None,
                    help="folder for the runs (default: build/spawn_soak/CASE)")
    ap.add_argument("--start-method", choices=("spawn", "fork"), default="spawn",
                    help="ACCUMCHECK_START_METHOD for the ranks (default spawn)")
    ap.add_argument("--cores", action="store_true",
                    help="core dumps on; an aborted run's stacks kept (gdb)")
    ap.add_argument("--stop-at-first", action="store_true",
                    help="stop at the first run that is not clean")
    ap.add_argument("--example-arg", action="append", default=[],
                    help="an extra argument for the example (repeatable)")
    a = ap.parse_args()

    work = os.path.abspath(a.work or os.path.join(ROOT, "build", "spawn_soak", a.case))
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    env["ACCUMCHECK_START_METHOD"] = a.start_method
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if a.case == "deepspeed":
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, "build", "torch_extensions"))

    def limit_core():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    counts = {"clean": 0, "abort": 0, "failed": 0}
    t0 = time.monotonic()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(a.runs):
        run = os.path.join(work, "run%03d" % i)
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(run)
        trace = os.path.join(run, "trace")
        argv = [a.python, os.path.join(ROOT, CASES[a.case][0])] + CASES[a.case][1:] + \
            a.example_arg + ["--out", trace, "--spawn", str(a.ranks)]
        p = subprocess.run(argv, cwd=run, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           preexec_fn=limit_core if a.cores else None)
        kind, why = classify(p.returncode, p.stdout, trace)
        counts[kind] += 1
        print("run %3d: %-6s exit %d%s" % (i, kind, p.returncode, ("  " + why) if why else ""),
              flush=True)
        if kind == "clean":
            shutil.rmtree(run, ignore_errors=True)
            continue
        with open(os.path.join(run, "output.txt"), "w") as f:
            f.write(p.stdout)
        for core in glob.glob(os.path.join(run, "core*")):
            with open(os.path.join(run, "stacks.txt"), "a") as f:
                f.write("== %s\n" % core)
                f.write(stacks(a.python, core))
            print("         stacks: %s" % os.path.join(run, "stacks.txt"), flush=True)
        if a.stop_at_first:
            break
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = sum(counts.values())
    print("spawn_soak %s (%s, %d ranks): %d runs: %d clean, %d aborted, %d failed "
          "(%.0f s wall, %.0f s CPU)" % (
              a.case, a.start_method, a.ranks, done, counts["clean"], counts["abort"],
              counts["failed"], time.monotonic() - t0,
              (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)))
    return 0 if counts["clean"] == done else 1


if __name__ == "__main__":
    sys.exit(main())
