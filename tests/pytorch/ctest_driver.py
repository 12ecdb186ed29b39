"""CTest driver: export -> train with an example -> certify, and check.

    python3 ctest_driver.py --accumcheck BIN --scenario S.toml \
        --example examples/train_x.py --work DIR --expect-exit N \
        [--expect-pitfall ID] [--expect-text TEXT ...]

Passes when certify exits with N and, for a FAIL, its diagnosis line says
"matches ID" (ID first among any ties), and its output holds every TEXT.
Prints the margin line the README reports: "max error X of bound" for a
PASS, the runner-up's ratio for a FAIL.

With --compare (issue 14) the same trace is certified four more ways and
each must agree with the default run (double-double bound, every core):
  mpfr     --bound-arith mpfr: the same exit code, verdict (PASS/FAIL and
           the step it names), pitfall and ranking order;
  threads  --threads 1 and --threads 3: stdout and JUnit byte for byte
           (JUnit's time attribute aside);
  parts    --steps 0:m and m: with --part, merged by certify-merge: the
           same exit code, verdict line and JUnit test cases.

With --identity the example also runs with its Recorder replaced by none
(oracle_identity.py): the trained model (each rank's) must be the same
bits with and without the recorder.
"""
import re
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time

import warm_python


def trainer_argv(train, ranks, launcher):
    """The Python arguments that run the trainer script `train` (its
    path and arguments) with `ranks` ranks: under torchrun, or with the
    script's own --spawn R (torch.multiprocessing.spawn)."""
    if ranks > 1 and launcher == "torchrun":
        # --redirects/--tee 9:1: Debian's torch 1.13 torchrun fails on
        # Python 3.11 with its default "0"; a map naming no local rank is
        # the same setting.  --monitor_interval 0.2: the agent looks at its
        # workers every 5 s by default, so a run of 2 s took 7; how often
        # it looks changes nothing the workers do.
        # Under CTest's warm Python (warm_python.py), each worker is
        # `python3 warm_python.py exec SCRIPT ...` (--no_python): a fork of
        # the server that has imported torch, instead of a fresh `python3
        # -u SCRIPT` importing it again (1.5 s of CPU a rank).
        warm = (["--no_python", sys.executable,
                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_python.py"),
                 "exec"] if os.environ.get("ACCUMCHECK_WARM_PYTHON") else [])
        return ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(ranks), "--redirects", "9:1", "--tee", "9:1",
                "--monitor_interval", "0.2"] + warm + train
    if ranks > 1:
        return train + ["--spawn", str(ranks)]
    return train


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accumcheck", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--expect-exit", type=int, required=True)
    ap.add_argument("--expect-pitfall")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--expect-text", action="append", default=[])
    ap.add_argument("--ranks", type=int, default=1,
                    help="DDP ranks: one trainer process per rank (gloo)")
    ap.add_argument("--launcher", choices=("torchrun", "spawn"), default="torchrun",
                    help="with --ranks > 1: torchrun, or the example's own --spawn R "
                         "(torch.multiprocessing.spawn)")
    ap.add_argument("--example-arg", action="append", default=[],
                    help="an extra argument for the example (repeatable)")
    ap.add_argument("--certify-arg", action="append", default=[],
                    help="passed to every certify (--certify-arg=--precision=bf16)")
    ap.add_argument("--identity", action="store_true",
                    help="the trainer also runs without its Recorder (oracle_identity.py): "
                    "each rank's trained model must be the same bits")
    args = ap.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    bundle = os.path.join(args.work, "bundle")
    trace = os.path.join(args.work, "trace")
    subprocess.run([args.accumcheck, "export", args.scenario, "--out", bundle, "--quiet"],
                   check=True)
    recorded = recorded_run(args.work)
    reused = bool(recorded) and same_files(bundle, os.path.join(recorded, "bundle"))
    if reused:
        shutil.copytree(os.path.join(recorded, "trace"), trace)
        print("driver: trace reused from %s (this build's export is byte for byte "
              "the bundle that trainer read)" % recorded)
    else:
        if recorded:
            print("driver: this build's export differs from %s's bundle: the trainer runs"
                  % recorded)
        example = [args.example, "--bundle", bundle, "--out", trace] + args.example_arg
        digests = [os.path.join(args.work, k + ".sha256") for k in ("recorded", "plain")]
        if args.identity:
            example = [os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "oracle_identity.py"), "--digest", digests[0], "--"] + example
        train = trainer_argv(example, args.ranks, args.launcher)
        t0 = time.monotonic()
        warm_python.run(train, check=True)
        print("driver: trainer ran in %.1f s%s" % (
            time.monotonic() - t0, " (%d ranks, %s)" % (args.ranks, args.launcher)
            if args.ranks > 1 else ""))
        if args.identity and not same_without_recorder(args, example, digests):
            return 1
    scenario = os.path.join(bundle, "scenario.toml")

    def certify(*extra, junit="junit.xml"):
        return subprocess.run([args.accumcheck, "certify", scenario, "--trace", trace,
                               "--junit", os.path.join(args.work, junit),
                               *args.certify_arg, *extra],
                              capture_output=True, text=True)

    cert = certify()
    sys.stdout.write(cert.stdout)
    sys.stderr.write(cert.stderr)
    if cert.returncode != args.expect_exit:
        print("driver: certify exited %d, expected %d" % (cert.returncode, args.expect_exit))
        return 1
    if args.expect_pitfall:
        want = "diagnosis: matches %s " % args.expect_pitfall
        want_tie = "diagnosis: matches, tied (all within the bound): %s " % args.expect_pitfall
        if want not in cert.stdout and want_tie not in cert.stdout:
            print("driver: the diagnosis does not name %s first" % args.expect_pitfall)
            return 1
    if not os.path.exists(os.path.join(args.work, "junit.xml")):
        print("driver: no JUnit file")
        return 1
    # A text is looked for in the output, then in the JUnit file (every
    # check's message: the output shows the first failing one only).
    with open(os.path.join(args.work, "junit.xml")) as f:
        junit = f.read()
    for text in args.expect_text:
        if text not in cert.stdout and text not in junit:
            print("driver: certify's output and JUnit do not say: %s" % text)
            return 1
    if args.compare:
        done = compared_before(args.work, recorded if reused else None, cert.stdout)
        if done:
            print("driver: --compare not run again: certify's output and JUnit are "
                  "byte for byte those of %s's run, whose --compare passed" % done)
        elif not compare(args, cert, certify):
            return 1
        else:
            stamp_compared(args.work, cert.stdout)
    print("driver: ok")
    return 0


def same_without_recorder(args, example, digests):
    """The example run again with its Recorder replaced by none
    (oracle_identity.py --plain, its trace elsewhere) trains the same
    bits."""
    plain = list(example)
    plain[plain.index("--digest") + 1] = digests[1]
    plain.insert(1, "--plain")
    plain[plain.index("--out", plain.index("--")) + 1] = os.path.join(args.work, "plain-trace")
    warm_python.run(trainer_argv(plain, args.ranks, args.launcher), check=True)
    ranks = [""] if args.ranks == 1 else [".rank%d" % r for r in range(args.ranks)]
    for r in ranks:
        a, b = (open(d + r).read().strip() for d in digests)
        if a != b:
            print("driver: %sthe trained model differs with the recorder (sha256 %s) and without "
                  "it (%s): the recorder changed the run" % (r[1:] + ": " if r else "", a[:16], b[:16]))
            return False
    print("driver: trained model bit-identical with and without the recorder (sha256 %s%s)"
          % (a[:16], ", every one of %d ranks" % args.ranks if args.ranks > 1 else ""))
    return True


def in_recorded_build(path):
    """`path` (under ACCUMCHECK_THIS_BUILD) at the same place under
    ACCUMCHECK_RECORDED_BUILD, or None when either is unset or `path` is
    elsewhere (scripts/check-hardened.sh sets both; see recorded_run)."""
    this = os.environ.get("ACCUMCHECK_THIS_BUILD")
    other = os.environ.get("ACCUMCHECK_RECORDED_BUILD")
    if not this or not other:
        return None
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(this))
    return None if rel.startswith("..") else os.path.join(other, rel)


def recorded_run(work):
    """The folder where another build ran this same test, or None.

    scripts/check-hardened.sh sets ACCUMCHECK_RECORDED_BUILD to the build/
    folder of scripts/test.sh's run and ACCUMCHECK_THIS_BUILD to its own
    (build-asan/): a test working in THIS/x/y takes the trace that the
    trainer wrote in RECORDED/x/y instead of running the trainer again, so
    every PyTorch case is judged by the sanitized accumcheck for the cost
    of its certify runs.  The Python trainer is the same program either
    way; what is under test is accumcheck's export, trace reader and
    certify.  Only a complete earlier run counts (its trace and, for a
    bundle, the bundle it read)."""
    path = in_recorded_build(work)
    if not path:
        return None
    meta = [os.path.join(path, "trace", "complete.csv"), os.path.join(path, "complete.csv")]
    meta = [m for m in meta if os.path.isfile(m)]
    if not meta:
        return None
    # A trace older than any Python file of the package, the example
    # trainers or these drivers was written by other code: record it again.
    return path if os.path.getmtime(meta[0]) > newest_python() else None


def newest_python():
    """The newest modification time of the Python files of the package,
    the example trainers and these drivers (what writes a trace)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return max(os.path.getmtime(os.path.join(d, f))
               for top in ("python", "examples", os.path.join("tests", "pytorch"))
               for d, _, files in os.walk(os.path.join(root, top)) for f in files if f.endswith(".py"))


def reseal(folder):
    """Rewrites folder/complete.csv (docs/trace-format.md) for the trace
    files the folder holds now, as a trainer writing its own trace would:
    for a case that edits a recorded trace (--contract-sub, --meta) to
    reach certify's checks past the completion record, which refuses any
    edit.  Written from the format, not with accumcheck_torch.trace
    (importing the package imports torch)."""
    rows = []
    for name in ("meta.csv", "events.csv", "values.csv", "values.bin", "state.csv",
                 "contract.csv", "schedule.csv"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            data = open(path, "rb").read()
            lines = str(data.count(b"\n") - 1) if name.endswith(".csv") else ""
            rows.append("%s,%s,%d,%s\n" % (name, lines, len(data), hashlib.sha256(data).hexdigest()))
    with open(os.path.join(folder, "complete.csv"), "w") as f:
        f.write("file,rows,bytes,sha256\n" + "".join(rows) + "complete.csv,%d,,\n" % len(rows))


COMPARED = "compared.ok"


def certify_digest(work, stdout):
    """SHA-256 of a certify run's stdout and JUnit file (its time
    attribute aside): what --compare's stamp names."""
    h = hashlib.sha256(stdout.encode())
    h.update(junit_cases(os.path.join(work, "junit.xml")).encode())
    return h.hexdigest()


def stamp_compared(work, stdout):
    """After --compare passed: the stamp (compared.ok) holding the digest
    of the default certify run that the four other ways agreed with."""
    with open(os.path.join(work, COMPARED), "w") as f:
        f.write(certify_digest(work, stdout) + "\n")


def compared_before(work, recorded, stdout):
    """The recorded build's folder when its run of this test passed
    --compare on the same trace with the same certify output and JUnit,
    byte for byte (its stamp holds this run's digest); else None.

    Under scripts/check-hardened.sh the sanitized accumcheck certifies the
    trace that scripts/test.sh's run recorded and compared (see
    recorded_run).  What --compare establishes -- MPFR's verdict, thread
    counts and parts agreeing with the default run -- is then already
    established for this output; what the sanitizers watch in the MPFR,
    thread and parts paths, the GoogleTest tests CertifyScale.* run under
    them (DoubleDoubleGivesMpfrsVerdicts, ThreadCountDoesNotChangeTheReport,
    PartsMergeIntoOneCertify).  A different output, no stamp, or a stamp
    older than that build's accumcheck runs --compare in full."""
    if not recorded:
        return None
    build = os.environ["ACCUMCHECK_RECORDED_BUILD"]
    stamp = os.path.join(recorded, COMPARED)
    try:
        with open(stamp) as f:
            digest = f.read().strip()
        # A stamp older than that build's accumcheck came from other code.
        if os.path.getmtime(stamp) < os.path.getmtime(
                os.path.join(build, "cli", "accumcheck")):
            return None
    except OSError:
        return None
    return build if digest == certify_digest(work, stdout) else None


def same_files(a, b):
    """Whether folders a and b hold the same files, byte for byte."""
    def listing(root):
        out = {}
        for d, _, files in os.walk(root):
            for f in files:
                full = os.path.join(d, f)
                out[os.path.relpath(full, root)] = full
        return out
    la, lb = listing(a), listing(b)
    if sorted(la) != sorted(lb):
        return False
    for k in la:
        with open(la[k], "rb") as fa, open(lb[k], "rb") as fb:
            if fa.read() != fb.read():
                return False
    return True


def junit_cases(path, bodies=True):
    """The JUnit file without its time attribute (and failure bodies: the
    diagnosis, which a merge takes from one part)."""
    with open(path) as f:
        text = re.sub(r' time="[^"]*"', "", f.read())
    if not bodies:
        text = re.sub(r'(<failure message="[^"]*">)[^<]*(</failure>)', r"\1\2", text)
    return text


def summary(stdout):
    """Verdict line, matched pitfall and ranking names of a certify output."""
    lines = stdout.splitlines()
    verdict = lines[1] if len(lines) > 1 else ""
    verdict = re.sub(r"\(max error [^)]*\)", "", verdict)
    m = re.search(r"diagnosis: matches(?:, tied \(all within the bound\):)? ([^ ]+)", stdout)
    ranking = [re.sub(r"^\s*\d+\.\s+\S+\s+", "", line) for line in lines
               if re.match(r"^\s+\d+\. ", line)]
    ranking = [re.sub(r" \(\d+ steps\)$", "", r.lstrip("* ")) for r in ranking]
    return verdict, m.group(1) if m else None, ranking


def compare(args, cert, certify):
    ok = True
    # Double-double vs MPFR.
    mp = certify("--bound-arith", "mpfr", junit="junit-mpfr.xml")
    a, b = summary(cert.stdout), summary(mp.stdout)
    if (mp.returncode, a) != (cert.returncode, b):
        print("driver: dd and mpfr differ:\n  dd:   %s\n  mpfr: %s" % (a, b))
        sys.stdout.write(mp.stdout)
        ok = False
    else:
        print("driver: dd and mpfr agree: exit %d, %s" % (mp.returncode, a[0]))
    # One thread, three threads: byte for byte.
    base = junit_cases(os.path.join(args.work, "junit.xml"))
    for n in ("1", "3"):
        t = certify("--threads", n, junit="junit-t%s.xml" % n)
        if t.stdout != cert.stdout or junit_cases(os.path.join(args.work, "junit-t%s.xml" % n)) != base:
            print("driver: --threads %s output differs from the default run" % n)
            sys.stdout.write(t.stdout)
            ok = False
    print("driver: --threads 1 and 3: the same output")
    # Two parts, merged.
    steps = int(re.search(r"(\d+) optimizer steps", cert.stdout).group(1))
    m = steps // 2
    p1, p2 = (os.path.join(args.work, "part%d.txt" % i) for i in (1, 2))
    for rng, part in (("0:%d" % m, p1), ("%d:" % m, p2)):
        certify("--steps", rng, "--part", part, junit="junit-part.xml")
    merged = subprocess.run([args.accumcheck, "certify-merge", p2, p1, "--junit",
                             os.path.join(args.work, "junit-merged.xml")],
                            capture_output=True, text=True)
    same_verdict = merged.stdout.splitlines()[1:2] == cert.stdout.splitlines()[1:2]

    # The notes too (Adam's moments, unforced clips and the autocast
    # bound's use over every part's steps).
    def notes(out):
        return [n for n in out.splitlines() if n.startswith("note: ")]
    same_verdict = same_verdict and notes(merged.stdout) == notes(cert.stdout)
    if (merged.returncode != cert.returncode or not same_verdict or
            junit_cases(os.path.join(args.work, "junit-merged.xml"), False) !=
            junit_cases(os.path.join(args.work, "junit.xml"), False)):
        print("driver: certify-merge of steps 0:%d and %d: differs (exit %d)" %
              (m, m, merged.returncode))
        sys.stdout.write(merged.stdout + merged.stderr)
        ok = False
    else:
        print("driver: steps 0:%d + %d: merged: the same verdict, notes and JUnit" % (m, m))
    return ok


if __name__ == "__main__":
    sys.exit(main())
