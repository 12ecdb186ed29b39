"""One Frameworks.* CTest case: a framework case script (this folder) run
by the framework's own venv python, then `accumcheck certify --contract`
(tests/pytorch/ctest_contract.py's judge); passes when certify's exit code
is the expected one and its output holds the expected texts.

    ctest_framework.py ACCUMCHECK OUTDIR CODE [--text T]... -- FRAMEWORK_PYTHON CASE.py [ARGS...]

CODE "refused": the case itself must exit 2 (bad input refused before
training) with the texts in its output; certify is not run."""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pytorch"))
from ctest_contract import judge  # noqa: E402


def main():
    argv = sys.argv[1:]
    cut = argv.index("--")
    head, run = argv[:cut], argv[cut + 1:]
    tool, out, code = head[0], head[1], head[2]
    texts = [head[i + 1] for i, a in enumerate(head) if a == "--text"]
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    r = subprocess.run([run[0], os.path.join(HERE, run[1]), "--out", out] + run[2:],
                       capture_output=True, text=True, env=env)
    if code == "refused":
        sys.stdout.write(r.stdout + r.stderr)
        bad = [] if r.returncode == 2 else ["the case exited %d, expected 2" % r.returncode]
        bad += ["the case's output lacks %r" % t for t in texts if t not in r.stdout + r.stderr]
        for b in bad:
            print("ctest_framework: " + b)
        return 1 if bad else 0
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        print("ctest_framework: the case failed (exit %d)" % r.returncode)
        return 1
    return judge(tool, out, int(code), texts)


if __name__ == "__main__":
    sys.exit(main())
