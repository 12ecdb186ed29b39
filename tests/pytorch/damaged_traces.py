"""The damaged-trace battery: no verdict from a trace that is not what a
finished run wrote (docs/trace-format.md, "complete.csv").

    damaged_traces.py --accumcheck BIN --work DIR [--seed N] [--random-cuts N] [--ddp]

Records small traces once, in this process (torch imported once, one
thread), two runs of each tier into the same scenario:
  oracle    certify-mlp (9 optimizer steps), Recorder: the correct loop (A,
            PASS) and zero_grad inside the micro-batch loop (B, FAIL);
            meta.csv, events.csv, values.bin
  contract  a Linear model, K = 2, 6 optimizer steps, ContractRecorder with
            a declared schedule: the correct loop (A, PASS) and the loop
            without the 1/N_w (B, FAIL); meta.csv, events.csv, values.csv,
            contract.csv, schedule.csv
  ddp       (--ddp) examples/contract/train_ddp.py --spawn 2 --K 2, 32
            samples: the correct loop (A, PASS) and each rank's own mean
            (B, FAIL); the rank column; and a run whose rank 1 dies
            (--die-after 3)
then damages every file of each A (complete.csv included): cut at every
line end (down to the header alone), at N seeded random bytes, emptied,
removed, and swapped with B's file.  And runs that did not finish, each a
fork of this process that ends as a script does (the interpreter's own
exit), recording into a folder that holds B's complete trace (a stale
trace must not be judged either): an exception, KeyboardInterrupt (inside
`with`, and a SIGINT the script does not catch), SIGTERM, SIGKILL, close()
in a `finally` while an exception propagates, the interpreter's exit
without close(), and (contract tier) a refusal (a second optimizer
attached) that the trainer catches before it calls close().

Under scripts/check-hardened.sh (ACCUMCHECK_RECORDED_BUILD and
ACCUMCHECK_THIS_BUILD, as ctest_driver.recorded_run) the traces that
scripts/test.sh's run of this test recorded (A, B, every run that did not
finish, the rank that died: kept in its work folder, with its stamp
recorded.ok) are judged instead of recording them again, when that run
passed, read a bundle byte for byte the one the sanitized accumcheck
exported here, and is newer than every Python file of the package, the
examples and these drivers: the trainers are the same Python program in
either build (their exit codes were checked there), what the sanitizers
watch is accumcheck's reading of each damaged trace, and every case is
still certified.

Every case must end `accumcheck certify` with exit 2 and a message naming
the damaged file (a swapped complete.csv: any file it lists) or what
ended the run.  The pristine A and B traces must get verdicts (exit 0 and
1), so the battery cannot pass on a certify that refuses everything.
Prints the count of each class and `driver: ok` when no case got a
verdict (or another exit code, or a message that names neither).
"""

import argparse
import functools
import gc
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ctest_driver  # noqa: E402  tests/pytorch/ctest_driver.py: in_recorded_build, same_files
import warm_python  # noqa: E402  tests/pytorch/warm_python.py

ORACLE_SCENARIO = os.path.join(ROOT, "scenarios", "certify-mlp.toml")
TRACE_FILES = ("meta.csv", "events.csv", "values.csv", "values.bin", "state.csv", "contract.csv",
               "schedule.csv", "complete.csv")


# ---- the trainers (run in this process, or in a fork of it)

def oracle_loop(bundle, out, mode="correct", stop=None, after=0, use_with=False):
    """The examples' correct loop (mode "zero_grad_inside": zero_grad at
    the top of the micro-batch loop) under Recorder; stop: how the run
    ends after `after` optimizer steps (see stop_now)."""
    import torch

    from accumcheck_torch import Recorder
    model = bundle.model()
    optimizer = bundle.optimizer(model)
    scheduler = bundle.scheduler(optimizer)
    rec = Recorder(bundle, model, optimizer, scheduler, out=out, quiet=True)

    def loop():
        K, steps = bundle.accumulation, 0
        for epoch in range(bundle.epochs):
            batches = bundle.micro_batches(epoch)
            for i, (x, y) in enumerate(batches):
                if mode == "zero_grad_inside":
                    optimizer.zero_grad()
                window = batches[(i // K) * K:(i // K) * K + K]
                n = sum(bundle.items(wy) for _, wy in window)
                bundle.window_loss(model(x), y, n).backward()
                if (i + 1) % K == 0 or i + 1 == len(batches):
                    if bundle.clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                    steps += 1
                    if steps == after:
                        stop_now(stop, rec)
    run_to_end(rec, loop, stop, use_with)


def contract_loop(out, mode="correct", stop=None, after=0, use_with=False, seed=0):
    """A Linear model's correct loop (mode "no_div": the summed loss not
    divided by the window's items) under ContractRecorder, K = 2, 2
    epochs of 3 windows, a declared (constant) LambdaLR schedule."""
    import torch

    from accumcheck_torch import ContractRecorder, Refused
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(4, generator=g), torch.randn(2, generator=g)) for _ in range(24)]
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def summed(m, b):
        return ((m(b[0]) - b[1]) ** 2).sum()

    rec = ContractRecorder(model, opt, summed, lambda b: b[0].shape[0], accumulation=2, out=out,
                           quiet=True,
                           schedule=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda n: 1.0))

    def loop():
        steps = 0
        for _ in range(2):
            batches = list(rec.watch(loader))
            for start in range(0, len(batches), 2):
                window = batches[start:start + 2]
                n = sum(b[0].shape[0] for b in window)
                for b in window:
                    loss = summed(model, b)
                    (loss if mode == "no_div" else loss / n).backward()
                opt.step()
                opt.zero_grad()
                steps += 1
                if steps == after and stop == "refused":
                    try:  # a second optimizer: refused
                        rec.attach(torch.optim.SGD(model.parameters(), lr=0.1))
                    except Refused:
                        pass  # the trainer goes on, and closes the recorder
                elif steps == after:
                    stop_now(stop, rec)
    run_to_end(rec, loop, stop, use_with)


def stop_now(stop, rec):
    """Ends the run the way `stop` says, mid-training."""
    if stop in ("raise", "finally"):
        raise RuntimeError("the trainer's own error")
    if stop == "keyboard":
        raise KeyboardInterrupt
    if stop in ("sigterm", "sigint", "sigkill"):
        os.kill(os.getpid(), getattr(signal, stop.upper()))
        time.sleep(5)  # the signal ends the process (SIGINT: KeyboardInterrupt, here)
    if stop == "exit":
        raise SystemExit(0)  # sys.exit() mid-run: the recorder is never closed


def run_to_end(rec, loop, stop, use_with):
    if use_with:
        with rec:
            loop()
    elif stop == "finally":
        try:
            loop()
        finally:
            rec.close()
    else:
        loop()
        rec.close()


# ---- the battery

class Battery:
    def __init__(self, accumcheck, work):
        self.accumcheck, self.work = accumcheck, work
        self.counts, self.bad, self.n = {}, [], 0

    def certify(self, folder, scenario):
        argv = [self.accumcheck, "certify"] + ([scenario] if scenario else ["--contract"]) + \
            ["--trace", folder]
        return subprocess.run(argv, capture_output=True, text=True)

    def expect_refused(self, cls, what, folder, scenario, names, also=(), keep=False):
        """One case: certify on `folder` must exit 2 naming one of `names`
        (and saying each of `also`); the folder is removed unless `keep`
        (a recorded run's, which the sanitized build judges again)."""
        self.n += 1
        self.counts[cls] = self.counts.get(cls, 0) + 1
        r = self.certify(folder, scenario)
        said = r.stdout + r.stderr
        if r.returncode != 2 or not any(n in r.stderr for n in names) or \
                not all(t in r.stderr for t in also):
            names = list(names) + list(also)
            verdict = r.returncode in (0, 1)
            self.bad.append("%s %s: %s, exit %d%s\n    %s" % (
                cls, what, "A VERDICT" if verdict else "not refused as expected", r.returncode,
                "" if r.returncode != 2 else " without naming %s" % " or ".join(names),
                said.strip()[-600:]))
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)

    def expect_verdict(self, folder, scenario, code):
        r = self.certify(folder, scenario)
        if r.returncode != code:
            self.bad.append("pristine %s: exit %d, expected %d\n    %s"
                            % (folder, r.returncode, code, (r.stdout + r.stderr).strip()[-600:]))

    def damage(self, tier, a, b, scenario, seed, random_cuts):
        """Every file of trace `a` cut at every line end and at random
        bytes, emptied, removed, swapped with `b`'s."""
        rng = random.Random(seed)
        files = [f for f in TRACE_FILES if os.path.isfile(os.path.join(a, f))]
        listed = [f for f in files if f != "complete.csv"]
        for f in files:
            data = open(os.path.join(a, f), "rb").read()
            names = [f]
            ends = [i + 1 for i, c in enumerate(data[:-1]) if c == 0x0A]
            others = [i for i in range(1, len(data)) if i not in set(ends)]
            cuts = [("line end", i) for i in ends] + \
                [("byte", i) for i in sorted(rng.sample(others, min(random_cuts, len(others))))]
            for kind, at in cuts:
                self.expect_refused("%s cut at a %s" % (tier, kind), "%s[:%d]" % (f, at),
                                    self.variant(a, f, data[:at]), scenario, names)
            self.expect_refused("%s emptied" % tier, f, self.variant(a, f, b""), scenario, names)
            self.expect_refused("%s removed" % tier, f, self.variant(a, f, None), scenario, names)
            other = os.path.join(b, f)
            if os.path.isfile(other) and open(other, "rb").read() != data:
                # A swapped complete.csv vouches for B's files: the first of
                # A's that differs is named.
                self.expect_refused("%s swapped between runs" % tier, f,
                                    self.variant(a, f, open(other, "rb").read()), scenario,
                                    listed if f == "complete.csv" else [f])

    def variant(self, src, f, data):
        """A copy of trace `src` with file f's bytes `data` (None: removed)."""
        self.k = getattr(self, "k", 0) + 1
        out = os.path.join(self.work, "case%d" % self.k)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out)
        if data is None:
            os.unlink(os.path.join(out, f))
        else:
            with open(os.path.join(out, f), "wb") as fh:
                fh.write(data)
        return out


def forked(fn, log):
    """fn() in a fork of this process that then leaves through the
    interpreter's own exit (atexit handlers, an unhandled exception's
    sys.last_value), as a script's process does; returns its exit code.
    The child's exception unwinds through no handler of the parent's."""
    sys.stdout.flush()
    sys.stderr.flush()
    # What this process holds (torch's heap) out of the collector's reach:
    # the child's exit collects garbage before it tears down the modules,
    # and a collection over torch's whole heap writes every object's header,
    # copying each page from this process (1.3 s of CPU a fork, 0.4 s
    # with this; the child's own objects are collected as before).
    gc.freeze()
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    fn()
    raise SystemExit(0)


# How each unfinished run ends: (stop, inside `with`, what certify's
# message must name, the trainer's exit code).
UNFINISHED = [
    ("raise", True, "RuntimeError: the trainer's own error", 1),
    ("keyboard", True, "KeyboardInterrupt", -signal.SIGINT),
    ("sigint", False, "KeyboardInterrupt", -signal.SIGINT),
    ("sigterm", False, "SIGTERM", -signal.SIGTERM),
    ("sigkill", False, "the process died while recording", -signal.SIGKILL),
    ("finally", False, "RuntimeError: the trainer's own error", 1),
    ("exit", False, "the interpreter exited without the recorder's close()", 0),
    ("refused", False, "the recorder refused: ContractRecorder.attach: an optimizer is already attached", 0),
]


RECORDED = "recorded.ok"


def recorded_before(work, bundle, ddp):
    """The recorded build's work folder for this test when its traces can
    be judged here instead of recording them again (see the module's
    docstring), else None."""
    path = ctest_driver.in_recorded_build(work)
    if not path:
        return None
    stamp = os.path.join(path, RECORDED)
    try:
        with open(stamp) as f:
            if f.read().strip() != "ddp=%d" % ddp:
                return None
        if os.path.getmtime(stamp) <= ctest_driver.newest_python():
            return None  # recorded by other code
    except OSError:
        return None
    return path if ctest_driver.same_files(bundle, os.path.join(path, "bundle")) else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accumcheck", default="accumcheck")
    ap.add_argument("--work", default="damaged_traces")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--random-cuts", type=int, default=4)
    ap.add_argument("--ddp", action="store_true", help="also a 2-rank DDP contract trace")
    a = ap.parse_args()
    t0, cpu0 = time.monotonic(), os.times()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731
    subprocess.run([a.accumcheck, "export", ORACLE_SCENARIO, "--out", w("bundle"), "--quiet"],
                   check=True)
    scenario = w("bundle", "scenario.toml")
    recorded = recorded_before(a.work, w("bundle"), a.ddp)
    if recorded:
        # Every trace that run recorded, judged again here (no torch).
        for name in sorted(os.listdir(recorded)):
            if name != "bundle" and os.path.isdir(os.path.join(recorded, name)):
                shutil.copytree(os.path.join(recorded, name), w(name))
        print("damaged traces: the traces %s's run recorded (the same bundle, byte for byte), "
              "not recorded again" % os.environ["ACCUMCHECK_RECORDED_BUILD"])
    else:
        import torch
        torch.set_num_threads(1)  # the forks below run torch: no thread pool to inherit
        from accumcheck_torch import load_bundle

        bundle = load_bundle(w("bundle"))
        oracle_loop(bundle, w("oracle-A"))
        oracle_loop(bundle, w("oracle-B"), mode="zero_grad_inside")
        contract_loop(w("contract-A"))
        contract_loop(w("contract-B"), mode="no_div")
    bat = Battery(a.accumcheck, a.work)
    tiers = [("oracle", scenario, 1), ("contract", None, 1)]
    if a.ddp:
        script = os.path.join(ROOT, "examples", "contract", "train_ddp.py")
        # The launcher is a fork of CTest's warm Python when there is one
        # (warm_python.py, ACCUMCHECK_WARM_PYTHON), else a fresh
        # interpreter; its ranks fork it (torch imported once).
        os.environ["ACCUMCHECK_START_METHOD"] = "fork"
        for run, loop in (("A", "correct"), ("B", "local_mean")):
            if not recorded:
                warm_python.run([script, "--spawn", "2", "--loop", loop, "--K", "2", "--samples",
                                 "32", "--out", w("ddp-" + run)], check=True, capture_output=True)
        tiers.append(("ddp", None, 1))
    for tier, scen, b_code in tiers:
        bat.expect_verdict(w(tier + "-A"), scen, 0)
        bat.expect_verdict(w(tier + "-B"), scen, b_code)
        bat.damage(tier, w(tier + "-A"), w(tier + "-B"), scen, a.seed, a.random_cuts)
    # Runs that did not finish, each into a copy of B's complete trace.
    for tier, scen in (("oracle", scenario), ("contract", None)):
        for stop, use_with, names, code in UNFINISHED:
            if stop == "refused" and tier == "oracle":
                continue  # the oracle tier's Recorder refuses nothing once it records
            out = w("%s-%s" % (tier, stop))
            if not recorded:
                shutil.copytree(w(tier + "-B"), out)
                if tier == "oracle":
                    fn = functools.partial(oracle_loop, bundle, out, stop=stop, after=5,
                                           use_with=use_with)
                else:
                    fn = functools.partial(contract_loop, out, stop=stop, after=3, use_with=use_with)
                got = forked(fn, out + ".log")
                if got != code:
                    bat.bad.append("%s %s: the trainer exited %d, expected %d\n    %s" % (
                        tier, stop, got, code, open(out + ".log").read()[-600:]))
            # How far it got: the oracle tier knows the scenario's steps.
            far = "after %s%s" % ("at least " if stop == "sigkill" else "",
                                  "5 of 9 optimizer steps" if tier == "oracle" else "3 optimizer steps")
            bat.expect_refused("%s run that did not finish" % tier, stop, out, scen, [names],
                               also=[far], keep=True)
    if a.ddp:
        # A rank that dies mid-run (SIGKILL after its 3rd backward), into a
        # folder holding B's complete trace: every rank's marker is named.
        out = w("ddp-died")
        if not recorded:
            shutil.copytree(w("ddp-B"), out)
            r = warm_python.run([script, "--spawn", "2", "--K", "2", "--samples", "32",
                                 "--die-after", "3", "--out", out], capture_output=True, text=True)
            if r.returncode == 0:
                bat.bad.append("ddp died: the trainer exited 0")
        bat.expect_refused("ddp run that did not finish", "rank 1 killed", out, None,
                           ["rank1.incomplete"], also=["the recording of a multi-rank run did "
                                                       "not finish", "rank 1 of 2"], keep=True)
    print("damaged traces: %d cases" % bat.n)
    for cls in sorted(bat.counts):
        print("  %-44s %4d" % (cls, bat.counts[cls]))
    for b in bat.bad:
        print("FAIL " + b)
    cpu = os.times()
    print("verdicts or wrong refusals: %d; wall %.1f s, CPU %.1f s (this process and its children)" % (
        len(bat.bad), time.monotonic() - t0,
        cpu.user + cpu.system + cpu.children_user + cpu.children_system
        - cpu0.user - cpu0.system - cpu0.children_user - cpu0.children_system))
    if not bat.bad:
        if not recorded:
            with open(w(RECORDED), "w") as f:
                f.write("ddp=%d\n" % a.ddp)  # the traces above: a sanitized run may judge them
        print("driver: ok")
    return 1 if bat.bad else 0


if __name__ == "__main__":
    sys.exit(main())
