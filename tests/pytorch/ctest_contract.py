"""One contract-tier CTest case: a loop of train.py recorded by the
ContractRecorder, then `accumcheck certify --contract`; passes when the
exit code is the expected one and the output holds the expected texts.

    ctest_contract.py ACCUMCHECK OUTDIR CODE [--text T]... [--meta KEY=VALUE]... [--contract-sub OLD=NEW]...
        [--trainer FILE | --script PATH] [--ranks R --launcher torchrun|spawn] [--identity]
        -- TRAIN ARGS...

--meta sets a meta.csv key of the recorded trace before certify reads it
(bad input: certify must exit 2 naming the key); --contract-sub OLD=NEW
replaces text in its contract.csv (a trace made bad on purpose); --stages S
judges the S traces out/stage<i> of a pipeline trainer, each alike (a
text `stage<i>::T` is expected in stage i's output alone).  --trainer: the script
beside this one to run (default train.py), --script the path of another
(examples/systems/); --ranks R > 1 runs it with R
ranks, under torchrun or with its own --spawn R (train_ddp.py).
--trainer-exit N: the trainer is expected to exit N (a run a rank does
not finish; 2: one the recorder refused), in a fresh OUTDIR, and certify
judges what it left.  --identity: the trainer (examples/systems/, the
other contract trainers) runs without the recorder and then with it in
one process (its --identity PATH, examples/contract/identity.py): every
rank's trained parameters must be the same bits (train.py's runs are
compared so always, through its --digest and --plain-digest)."""

import glob
import os
import re
import shutil
import subprocess
import sys

import warm_python  # noqa: E402
from ctest_driver import recorded_run, reseal, trainer_argv


def main():
    argv = sys.argv[1:]
    cut = argv.index("--")
    head, train = argv[:cut], argv[cut + 1:]
    tool, out, code = head[0], head[1], int(head[2])
    texts = [head[i + 1] for i, a in enumerate(head) if a == "--text"]
    metas = [head[i + 1].split("=", 1) for i, a in enumerate(head) if a == "--meta"]
    opt = {a: head[i + 1] for i, a in enumerate(head)
           if a in ("--trainer", "--ranks", "--launcher", "--stages", "--script",
                    "--trainer-exit")}
    trainer_exit = int(opt.get("--trainer-exit", 0))
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "contract")
    script = opt.get("--script") or os.path.join(os.path.normpath(examples),
                                                 opt.get("--trainer", "train.py"))
    # train.py's runs are also run without the recorder (first, in the same
    # process: --plain-digest): the trained parameters must be the same bits
    # (the recorder never changes the run).
    unchanged = os.path.basename(script) == "train.py" and not trainer_exit and \
        int(opt.get("--ranks", 1)) == 1
    digests = (out + ".recorded.sha256", out + ".plain.sha256")
    identity = "--identity" in head and not trainer_exit
    for old in glob.glob(out + ".identity.rank*") + [d for d in digests if os.path.exists(d)]:
        os.remove(old)  # nothing of an earlier run compared
    # The folder the digests go to: the plain run (first) writes there
    # before the recorded run makes the trace's folder in it.
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    argv = trainer_argv([script, "--out", out] + train +
                        (["--digest", digests[0], "--plain-digest", digests[1]] if unchanged else []) +
                        (["--identity", out + ".identity"] if identity else []),
                        int(opt.get("--ranks", 1)), opt.get("--launcher", "spawn"))
    recorded = recorded_run(out)
    if recorded:
        # The recorded trace (ctest_driver.recorded_run) already carries
        # this test's edits below.
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(recorded, out)
        print("ctest_contract: trace reused from %s" % recorded)
        return judge_all(tool, out, code, texts, int(opt.get("--stages", 0)))
    if trainer_exit:
        shutil.rmtree(out, ignore_errors=True)  # nothing of an earlier run
    r = warm_python.run(argv, capture_output=True, text=True)
    sys.stdout.write(r.stdout + r.stderr)
    if r.returncode == 2 and code == 2 and not trainer_exit:
        # Bad input the recorder (or the system under it) refused: the
        # trainer's own exit 2 and its message are the result (with
        # --trainer-exit 2, certify's on the folder it left).
        missing = [t for t in texts if t not in r.stdout + r.stderr]
        for t in missing:
            print("ctest_contract: the trainer's output lacks %r" % t)
        return 1 if missing else 0
    if r.returncode != trainer_exit:
        print("ctest_contract: the trainer exited %d, expected %d" % (r.returncode, trainer_exit))
        return 1
    if unchanged and not same_without_recorder(script, train, digests):
        return 1
    if identity and not same_in_process(out + ".identity", int(opt.get("--ranks", 1))):
        return 1
    for sub in [head[i + 1] for i, a in enumerate(head) if a == "--contract-sub"]:
        old, new = sub.split("=", 1)
        path = os.path.join(out, "contract.csv")
        text = open(path).read()
        if old not in text:
            print("ctest_contract: contract.csv lacks %r" % old)
            return 1
        with open(path, "w") as f:
            f.write(text.replace(old, new))
    if metas:
        path = os.path.join(out, "meta.csv")
        rows = [r.split(",", 1) for r in open(path).read().splitlines()]
        keep = [r for r in rows if r[0] not in {k for k, _ in metas}]
        with open(path, "w") as f:
            f.write("".join(",".join(r) + "\n" for r in keep + metas))
    if metas or "--contract-sub" in head:
        reseal(out)  # the edited trace as a writer of its own would seal it
    return judge_all(tool, out, code, texts, int(opt.get("--stages", 0)))


def same_without_recorder(script, train, digests):
    """The trainer's run without the recorder (train.py --plain-digest: the
    same loop first, in its process) gives the same trained parameters,
    bit for bit."""
    try:
        a, b = (open(d).read().strip() for d in digests)
    except OSError as e:
        print("ctest_contract: the trainer wrote no digest of its two runs (%s)" % e)
        return False
    if a != b:
        print("ctest_contract: the trained parameters differ with the recorder (sha256 %s) "
              "and without it (%s): the recorder changed the run" % (a[:16], b[:16]))
        return False
    print("ctest_contract: trained parameters bit-identical with and without the recorder "
          "(sha256 %s)" % a[:16])
    return True


def same_in_process(path, ranks):
    """Each rank's path.rank<r> (identity.twice) says the same SHA-256 of
    its trained parameters without the recorder and with it."""
    bad = 0
    for r in range(ranks):
        try:
            got = dict(line.split() for line in open("%s.rank%d" % (path, r)).read().splitlines())
        except (OSError, ValueError) as e:
            print("ctest_contract: rank %d wrote no digests of its two runs (%s)" % (r, e))
            return False
        if set(got) != {"plain", "recorded"} or got["plain"] != got["recorded"]:
            print("ctest_contract: rank %d: the trained parameters differ with the recorder (sha256 "
                  "%s) and without it (%s): the recorder changed the run"
                  % (r, got.get("recorded", "-")[:16], got.get("plain", "-")[:16]))
            bad += 1
    if bad:
        return False
    print("ctest_contract: trained parameters bit-identical with and without the recorder on "
          "each of %d rank%s (one process: the plain run, then the recorded one)"
          % (ranks, "s" if ranks > 1 else ""))
    return True


def judge_all(tool, out, code, texts, stages):
    """judge() on out, or with --stages S on each of out/stage0 ..
    out/stage<S-1> (a pipeline's traces, one per stage)."""
    if not stages:
        return judge(tool, out, code, texts)

    def mine(i):
        own = "stage%d::" % i
        return [t[len(own):] if t.startswith(own) else t for t in texts
                if t.startswith(own) or not re.match(r"stage\d+::", t)]
    return max(judge(tool, os.path.join(out, "stage%d" % i), code, mine(i)) for i in range(stages))


def judge(tool, out, code, texts):
    """certify --contract on the trace in out: 0 when it exits with code
    and its output holds every text."""
    c = subprocess.run([tool, "certify", "--contract", "--trace", out], capture_output=True, text=True)
    sys.stdout.write(c.stdout + c.stderr)
    bad = []
    if c.returncode != code:
        bad.append("certify exited %d, expected %d" % (c.returncode, code))
    for t in texts:
        if t not in c.stdout + c.stderr:
            bad.append("the output lacks %r" % t)
    for b in bad:
        print("ctest_contract: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
