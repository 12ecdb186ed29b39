"""One contract-tier CTest case: a loop of train.py recorded by the
ContractRecorder, then `accumcheck certify --contract`; passes when the
exit code is the expected one and the output holds the expected texts.

    ctest_contract.py ACCUMCHECK OUTDIR CODE [--text T]... [--meta KEY=VALUE]... -- TRAIN ARGS...

--meta sets a meta.csv key of the recorded trace before certify reads it
(bad input: certify must exit 2 naming the key)."""

import os
import subprocess
import sys


def main():
    argv = sys.argv[1:]
    cut = argv.index("--")
    head, train = argv[:cut], argv[cut + 1:]
    tool, out, code = head[0], head[1], int(head[2])
    texts = [head[i + 1] for i, a in enumerate(head) if a == "--text"]
    metas = [head[i + 1].split("=", 1) for i, a in enumerate(head) if a == "--meta"]
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "train.py"), "--out", out] + train,
                       capture_output=True, text=True)
    sys.stdout.write(r.stdout + r.stderr)
    if r.returncode != 0:
        print("ctest_contract: the trainer failed (exit %d)" % r.returncode)
        return 1
    if metas:
        path = os.path.join(out, "meta.csv")
        rows = [r.split(",", 1) for r in open(path).read().splitlines()]
        keep = [r for r in rows if r[0] not in {k for k, _ in metas}]
        with open(path, "w") as f:
            f.write("".join(",".join(r) + "\n" for r in keep + metas))
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
