#!/usr/bin/env python3
"""The framework conformance matrix (docs/frameworks.md): for each framework
version in bench/conformance/versions.txt, a venv, every case of that
framework (tests/frameworks/<framework>_<case>.py), each run's contract
trace certified by build/cli/accumcheck, one cell per case.

    bench/conformance.py venv transformers==4.45.2   # make/reuse its venv, print its python
    bench/conformance.py run [--ci] [--only transformers] [--table FILE] [--json FILE]
    bench/conformance.py check transformers==4.45.2 sgd [partial ...] [--identity CASE ...]
        # cells of one venv against their expectations, in one process (CTest)

A framework venv (build/conformance/venvs/<fw>-<version>/) holds the
framework and what it needs, layered on the project's .venv (a .pth file
puts .venv's site-packages on its path: torch 2.13.0 and the other pins of
requirements.txt are installed once, and pip must keep them: they are its
constraints).  A version whose requirements cannot be met beside torch
2.13.0 and those pins gets the pip error as its cells.  accumcheck_torch
comes from python/ (PYTHONPATH), never installed into the venv.

A cell: PASS, or the pitfall certify's diagnosis names ('no modelled
pitfall' where none matches), with certify's margin (the weights' distance
to correct, in units of the uncertainty) and the first step and
micro-batch where the weights part from correct (certify's own evidence);
or 'refused (exit 2)' / 'error' with the message.  Nothing here knows what
a version should give except the `expect` column (the public reports),
which only `check` compares against.

Every cell of `run` also runs its case without the recorder first, in the
case's own process (--identity, tests/frameworks/_tiny.py): its JSON says
whether each rank's trained parameters are the same bits with and without
the recorder, and a cell where they differ says so in the table; `check
--identity` fails on it (the CI cells tests/frameworks/CMakeLists.txt
names).  `check` runs the cells it is given as `run` runs a row's: one
process that imports the framework once and forks each cell, so a cell
of the CI subset costs its training, not an interpreter's imports.
"""

import argparse
import concurrent.futures
import fcntl
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = os.path.join(ROOT, "bench", "conformance", "versions.txt")
VENVS = os.path.join(ROOT, "build", "conformance", "venvs")
WORK = os.path.join(ROOT, "build", "conformance", "runs")
CASES = os.path.join(ROOT, "tests", "frameworks")
# The wheels the venvs were made from, kept across checkouts as pip keeps
# its cache: a venv is made from them without asking the index (3 s of
# CPU where resolving against the index takes 12).
WHEELS = os.environ.get("ACCUMCHECK_WHEELS",
                        os.path.join(os.path.expanduser("~"), ".cache", "accumcheck", "wheels"))
CELLS = os.path.join(ROOT, "bench", "conformance", "cells.py")
BIN = os.environ.get("ACCUMCHECK_BIN", os.path.join(ROOT, "build", "cli", "accumcheck"))
CASE_TIMEOUT = 600
# The frameworks whose venvs are layered on .venv-jax (scripts/venv-jax.sh:
# jax, optax, flax, keras, itself layered on .venv), with
# requirements-jax.txt's pins as constraints too; the others on .venv.  A
# row's pins override a base pin (jax==0.4.30 jaxlib==0.4.30 for a release
# that needs an older jax): its venv holds its own copy, ahead on its path.
JAX_BASED = ("optax", "flax", "keras")


# A JAX-based case's environment: Keras on its JAX backend, on the CPU.
JAX_ENV = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}


def _jax_based(row):
    return row["framework"] in JAX_BASED


def read_versions(path=VERSIONS):
    """[{spec, framework, version, pins, ci, cells, expect: {case: cell}}]
    from versions.txt: `framework==version [pin ...] [ci] [cells=CASE,...]
    [case=expected ...]` (cells=: the row runs only these cells, a case
    name standing for all its variants)."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            fw, _, ver = words[0].partition("==")
            if not ver:
                sys.exit("%s:%d: expected framework==version first, got %r" % (path, n, words[0]))
            row = {"spec": words[0], "framework": fw, "version": ver, "pins": [], "ci": False,
                   "expect": {}, "cells": None}
            for w in words[1:]:
                if w == "ci":
                    row["ci"] = True
                elif w.startswith("ci="):
                    row["ci"] = w[3:].split(",")
                elif w.startswith("cells="):
                    row["cells"] = w[6:].split(",")
                elif "==" in w:
                    row["pins"].append(w)
                elif "=" in w:
                    case, _, cell = w.partition("=")
                    row["expect"][case] = cell
                else:
                    sys.exit("%s:%d: expected a pin (pkg==ver), 'ci', cells=CASE,... or case=expected, got %r"
                             % (path, n, w))
            rows.append(row)
    return rows


def row_of(spec):
    for row in read_versions():
        if row["spec"] == spec:
            return row
    fw, _, ver = spec.partition("==")
    if not ver:
        sys.exit("expected framework==version, got %r" % spec)
    return {"spec": spec, "framework": fw, "version": ver, "pins": [], "ci": False, "expect": {},
            "cells": None}


def base_site(row=None):
    """The site-packages a framework venv is layered on, one a line: the
    project .venv's (torch 2.13.0 and the pins), and before it .venv-jax's
    for a JAX-based framework (a .pth file's folder is put on the path,
    its own .pth files are not read: both are named)."""
    venvs = ([(".venv-jax", "scripts/venv-jax.sh")] if row and _jax_based(row) else []) + \
        [(".venv", "scripts/venv.sh")]
    sites = []
    for name, script in venvs:
        py = os.path.join(ROOT, name, "bin", "python")
        if not os.access(py, os.X_OK):
            sys.exit("no %s: run %s first (the framework venvs are layered on it)" % (name, script))
        out = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                             capture_output=True, text=True, check=True)
        # The real path: a worktree's .venv may be a link to another's, and a
        # venv made through the link must not name a folder that goes away.
        sites.append(os.path.realpath(out.stdout.strip()))
    return "\n".join(sites)


def relink(d, row=None):
    """A reused venv's link to .venv's site-packages (_accumcheck_base.pth)
    made to name this project's: one made from a checkout since removed
    names that checkout's .venv, and every cell would fail on 'No module
    named torch'."""
    want = base_site(row) + "\n"
    for pth in glob.glob(os.path.join(d, "lib", "python*", "site-packages",
                                      "_accumcheck_base.pth")):
        with open(pth) as f:
            if f.read() == want:
                continue
        with open(pth, "w") as f:
            f.write(want)


def _name(req):
    """A requirement's normalized project name ('fsspec' of 'fsspec==2024.12.0')."""
    return re.split(r"[<>=!~;\[ ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def constraints(row, d):
    """requirements.txt as pip constraints, less the packages the row pins
    itself (lightning 2.0 needs an fsspec older than .venv's): the venv then
    holds its own copy, ahead of .venv's on its path.  torch is never
    released: every cell runs torch 2.13.0."""
    mine = ({_name(p) for p in row["pins"]} | {_name(row["framework"])}) - {"torch"}
    lines = []
    for req in ["requirements.txt"] + (["requirements-jax.txt"] if _jax_based(row) else []):
        with open(os.path.join(ROOT, req)) as f:
            lines += [x for x in f if not x.strip() or x.lstrip().startswith("#")
                      or _name(x) not in mine]
    path = os.path.join(d, "constraints.txt")
    with open(path, "w") as f:
        f.writelines(lines)
    return path


def venv(row, quiet=False, defer=False):
    """The framework venv's python, made if missing: (python, seconds spent
    installing or 0, error or None).  defer (check): a venv pip has just
    made is not imported here, in a python of its own (2 to 4 s of CPU):
    the cells' own process imports torch (or jax) and the framework first
    and says how (cells.py's "imported" line), and imported_venv() then
    judges it and writes the marker; returns (python, seconds, error,
    pending), pending None where nothing is left to judge."""
    d = os.path.join(VENVS, "%s-%s" % (row["framework"], row["version"]))
    py = os.path.join(d, "bin", "python")
    ok, failed = os.path.join(d, ".installed"), os.path.join(d, ".failed")
    want = " ".join([row["spec"]] + row["pins"])
    for done in (ok, failed):
        if os.path.exists(done):
            with open(done) as f:
                said = f.read()
            if said.startswith(want + "\n"):  # made for these pins: reuse
                if done == ok:
                    relink(d, row)
                got = py, 0.0, said[len(want) + 1:] if done == failed else None
                return got + (None,) if defer else got
    t0 = time.time()
    base = os.path.join(ROOT, ".venv", "bin", "python")
    # No pip of its own (ensurepip's seconds): .venv's pip installs into it
    # (pip --python).
    subprocess.run([base, "-m", "venv", "--clear", "--without-pip", d], check=True)
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "_accumcheck_base.pth"), "w") as f:
        f.write(base_site(row) + "\n")
    # --no-compile: the modules a cell imports are compiled at its first
    # import (once: the .pyc stays in the venv), not the thousands it never
    # imports.  First from the wheels kept (WHEELS, no index); where one is
    # missing, pip downloads the row's wheels there (resolving against the
    # index) and installs from them.
    cons = constraints(row, d)
    reqs = [row["spec"]] + row["pins"]
    cmd = [base, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check",
           "--no-compile", "--no-index", "--find-links", WHEELS, "-c", cons] + reqs
    if not quiet:
        print("venv: %s" % " ".join(reqs), file=sys.stderr)
    os.makedirs(WHEELS, exist_ok=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        with open(os.path.join(WHEELS, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one download into WHEELS at a time
            p = subprocess.run([base, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                                "-d", WHEELS, "-c", cons] + reqs, capture_output=True, text=True)
            if p.returncode == 0:
                p = subprocess.run(cmd, capture_output=True, text=True)
    err = None
    if p.returncode == 0 and defer:
        return py, time.time() - t0, None, {"dir": d, "want": want, "t0": t0,
                                              "spent": time.time() - t0}
    if p.returncode == 0 and _jax_based(row):
        chk = subprocess.run([py, "-c", "import jax, %s as m; print(m.__version__)" % row["framework"]],
                             capture_output=True, text=True, check=False,
                             env=dict(os.environ, **JAX_ENV))
        err = import_error(row, chk.returncode == 0, chk.stdout.strip(),
                           (chk.stderr.strip().splitlines() or [""])[-1])
    elif p.returncode == 0:
        chk = subprocess.run([py, "-c", "import torch, %s; print(torch.__version__)"
                              % row["framework"].replace("-", "_")],
                             capture_output=True, text=True)
        err = import_error(row, chk.returncode == 0, chk.stdout.strip(),
                           (chk.stderr.strip().splitlines() or [""])[-1])
    else:
        lines = [x for x in p.stderr.splitlines() if "is ignored: it is neither" not in x]
        err = "pip cannot install it beside %s: %s" % (
            "jax and requirements-jax.txt's pins" if _jax_based(row) else "torch 2.13.0", " / ".join(
            x.strip() for x in lines if x.strip())[-600:])
    mark(py, d, want, time.time() - t0, err)
    return py, time.time() - t0, err


def import_error(row, ok, version, last):
    """The import check's verdict on a new venv, None or why it cannot run:
    the framework (and jax) imported, as the row's version for a JAX-based
    framework, beside torch 2.13.0 for the others (ok: the imports raised
    nothing; version: the framework's (JAX-based) or torch's __version__;
    last: the error's last line)."""
    if _jax_based(row):
        if not ok or version != row["version"]:
            return "installed, but it does not import as %s beside jax: %s" % (
                row["spec"], last if not ok else version)
        return None
    if not ok or not version.startswith("2.13.0"):
        return "installed, but importing it with torch 2.13.0 fails: %s" % (
            last if not ok else "torch %s" % version)
    return None


def imported_venv(row, pending, said):
    """venv(defer=True)'s pending venv judged by what the cells' process
    said of its imports (cells.py's "imported" line); writes the marker as
    venv() would.  Returns the error or None."""
    err = import_error(row, said.get("ok", False), said.get("version", ""),
                       said.get("error", ""))
    mark(os.path.join(pending["dir"], "bin", "python"), pending["dir"], pending["want"],
         pending["spent"], err)
    return err


def mark(py, d, want, spent, err):
    """The venv's marker (.installed, with freeze.txt, or .failed with the
    error): the next venv() reuses it."""
    ok, failed = os.path.join(d, ".installed"), os.path.join(d, ".failed")
    with open(failed if err else ok, "w") as f:
        f.write(want + "\n" + (err if err else "%.1f\n" % spent))
    if not err:
        # What pip freeze lists (every distribution on the venv's path,
        # .venv's too, less pip's own tools), read by importlib.metadata in
        # the venv's python: 0.1 s of CPU where pip freeze takes 1.
        with open(os.path.join(d, "freeze.txt"), "w") as f:
            subprocess.run([py, "-c", "import importlib.metadata as m; print('\\n'.join(sorted("
                            "{'%s==%s' % (x.metadata['Name'], x.version) for x in m.distributions()"
                            " if x.metadata['Name'].lower() not in ('pip', 'setuptools', 'wheel', "
                            "'distribute')}, key=str.lower)))"], stdout=f, stderr=subprocess.DEVNULL)


def variants_of(path):
    """The variants a case file declares (a module-level VARIANTS = [...]
    list: one cell each, named CASE.VARIANT), or None."""
    import ast

    with open(path) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "VARIANTS"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def cases_of(framework, only=None):
    names = []
    for f in sorted(os.listdir(CASES)):
        if not (f.startswith(framework + "_") and f.endswith(".py")):
            continue
        case = f[len(framework) + 1:-3]
        variants = variants_of(os.path.join(CASES, f))
        names += [case] if variants is None else ["%s.%s" % (case, v) for v in variants]
    return [c for c in names if only is None or c in only or c.split(".")[0] in only]


def parse(code, report):
    """(cell, margin, where, detail) from certify's output."""
    if code == 0:
        m = re.search(r"max ([0-9.e+-]+) of the uncertainty", report)
        return "PASS", m.group(1) if m else "", "", ""
    if code == 2:
        line = next((x for x in report.splitlines() if x.strip()), "")
        return "refused (exit 2)", "", "", line
    if code != 1:
        return "error (exit %d)" % code, "", "", report.strip().splitlines()[-1:] or ""
    m = re.search(r"diagnosis: matches(?:, tied \(all within the bound\):)? ([^ \n]+)", report)
    cell = m.group(1) if m else "no modelled pitfall"
    # Each channel its own diagnosis (the weights match one candidate, the
    # lr another or none): the cell is the pair, and an lr no modelled
    # pitfall explains is said, so no expectation of the weights alone
    # agrees with it (agrees()).
    split = re.search(r"diagnosis: matches (\S+) \(weights, max ([0-9.e+-]+) of the uncertainty\) "
                      r"and (.+) \(lr\)$", report, re.M)
    if split:
        lr_said = split.group(3)
        cell = "%s, lr: %s (fit %s)" % (split.group(1), "no modelled pitfall"
                                        if lr_said == "no modelled lr pitfall" else lr_said,
                                        split.group(2))
    w = re.search(r"^FAIL weights: .*?max ([0-9.e+-]+) of the uncertainty \((?:rank \d+ )?"
                  r"(step \d+) (micro-batch \d+): (weight [^,]+), (predicted [^)]+)\)", report, re.M)
    margin, where, detail = "", "", ""
    if w:
        margin, where, detail = w.group(1), "%s, %s" % (w.group(2), w.group(3)), \
            "%s, %s" % (w.group(4), w.group(5))
        first = re.search(r"^evidence: (step \d+ is the first whose weights leave \S+'s)", report, re.M)
        if first:
            detail += "; " + first.group(1)
    else:
        f = re.search(r"^FAIL ([^:]+): (.*)$", report, re.M)
        detail = "%s: %s" % (f.group(1), f.group(2)) if f else ""
        g = re.search(r"^FAIL weights: .*?max ([0-9.e+-]+|inf) of the uncertainty \((.*)\)$",
                      report, re.M)
        if g:  # the weights cannot be matched step by step (a step count differs)
            margin, where = g.group(1), g.group(2)
            ev = re.findall(r"^evidence: (.*)$", report, re.M)
            detail = "; ".join(ev[:3]) if ev else detail
    if m and not split:
        dm = re.search(r"diagnosis: matches .*\(max ([0-9.e+-]+) of the uncertainty\)", report)
        if dm:
            cell += " (fit %s)" % dm.group(1)
    return cell, margin, where, detail


def _adopt_orphans():
    """This process adopts its descendants' orphans (Linux
    PR_SET_CHILD_SUBREAPER): a rank a case's framework launched and never
    waited for (Lightning's strategy="ddp" Popen's its ranks and exits
    first) is then reaped here, and its CPU time counted in os.times()'s
    children."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def identity_of(path):
    """What the case's --identity PATH digests say (tests/frameworks/
    _tiny.py digested: each rank's 'plain R SHA' and 'recorded R SHA';
    the JAX examples' --identity: 'plain SHA' and 'recorded SHA', one
    process):
    'bit-identical', 'DIFFERS ...' (the recorder changed the run), or
    'not compared' (no digests: a run that cannot run twice in one
    process, _tiny.twice)."""
    files = sorted(glob.glob(path + ".rank*"))
    if not files:
        return "not compared"
    runs = {}
    for f in files:
        with open(f) as fh:
            for line in fh.read().splitlines():
                words = line.split()   # 'kind ranks sha', or 'kind sha' (one process)
                kind, ranks, sha = words if len(words) == 3 else (words[0], 1, words[1])
                runs.setdefault(f[len(path) + 5:], {})[kind] = (int(ranks), sha)
    ranks = max(r for got in runs.values() for r, _ in got.values())
    for rank in range(ranks):
        got = runs.get(str(rank), {})
        if set(got) != {"plain", "recorded"}:
            return "DIFFERS: rank %d digested %s" % (rank, " and ".join(sorted(got)) or "nothing")
        if got["plain"][1] != got["recorded"][1]:
            return "DIFFERS: rank %d's trained parameters (sha256 %s without the recorder, %s " \
                "with it): the recorder changed the run" % (rank, got["plain"][1][:16],
                                                          got["recorded"][1][:16])
    return "bit-identical"


def run_cases(row, cases, py, variant="default", report=None, identity=True, imported=None):
    """Runs the cases in the venv, one process for all (cells.py: the
    imports once, a fork per cell), and certifies each trace as its cell
    ends: a result dict per case, in the order given; report(res) as each
    is known.  identity (True, or the cases that do): each case runs without
    the recorder first, in its process (--identity), and res["identity"]
    says whether the trained parameters are the same bits (identity_of).
    imported: called with what the cells' process says of its imports
    before any cell runs (cells.py's "imported" line); where it returns
    False the cells are not run and run_cases returns None."""
    compared = set(cases) if identity is True else set(identity or ())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), CASES]),
               PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               OMP_NUM_THREADS="1", **(JAX_ENV if _jax_based(row) else {}))
    outs, lines = {}, []
    for case in cases:
        out = os.path.join(WORK, "%s-%s" % (row["framework"], row["version"]), case)
        subprocess.run(["rm", "-rf", out])
        os.makedirs(out)
        outs[case] = out
        script, _, declared = case.partition(".")  # CASE.VARIANT: a declared variant
        lines.append(json.dumps({
            "case": case, "script": os.path.join(CASES, "%s_%s.py" % (row["framework"], script)),
            "argv": ["--out", os.path.join(out, "trace"), "--variant", declared or variant]
            + (["--identity", os.path.join(out, "identity")] if case in compared else []),
            "log": os.path.join(out, "case.log")}) + "\n")
    p = subprocess.Popen([py, CELLS, CASES, row["framework"], str(CASE_TIMEOUT)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p.stdin.writelines(lines)
    p.stdin.close()
    results = {}
    for line in p.stdout:
        try:
            got = json.loads(line)
        except ValueError:
            continue  # a line a framework printed at import
        if not isinstance(got, dict) or "imported" in got:
            if isinstance(got, dict) and imported and not imported(got["imported"]):
                p.kill()
                p.wait()
                return None
            continue
        res = certify_cell(row, got["case"], outs[got["case"]], got, variant)
        if got["rc"] == 0:
            res["identity"] = (identity_of(os.path.join(outs[got["case"]], "identity"))
                               if got["case"] in compared else "not compared")
        results[got["case"]] = res
        if report:
            report(res)
    p.wait()
    for case in cases:  # the runner died before these (its import crashed)
        if case not in results:
            res = {"framework": row["framework"], "version": row["version"], "case": case,
                   "variant": variant, "cpu_s": 0.0, "wall_s": 0.0,
                   "expect": row["expect"].get(case, "PASS"), "margin": "", "where": "",
                   "cell": "case failed (exit %d)" % p.returncode,
                   "detail": "the venv's runner (bench/conformance/cells.py) ended first"}
            results[case] = res
            if report:
                report(res)
    return [results[c] for c in cases]


def certify_cell(row, case, out, got, variant):
    """The result dict of a cell whose case ended with got["rc"]: certify
    on its trace when it exited 0."""
    rc = got["rc"]
    res = {"framework": row["framework"], "version": row["version"], "case": case,
           "variant": variant, "cpu_s": got["cpu_s"], "wall_s": got["wall_s"],
           "expect": row["expect"].get(case, "PASS")}
    with open(os.path.join(out, "case.log")) as f:
        err = f.read()
    if rc == -14:
        err += "\ntimed out after %d s" % CASE_TIMEOUT
    if rc != 0:
        lines = [x for x in err.splitlines() if x.strip()]
        said = next((x for x in lines if x.startswith(("accumcheck_torch:", "accumcheck_jax:"))),
                    lines[-1] if lines else "")
        res.update(cell="refused (exit 2)" if rc == 2 else "case failed (exit %d)" % rc,
                   margin="", where="", detail=said[:300])
        return res
    p = subprocess.run([BIN, "certify", "--contract", "--trace", os.path.join(out, "trace")],
                       capture_output=True, text=True)
    with open(os.path.join(out, "certify.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    cell, margin, where, detail = parse(p.returncode, p.stdout + p.stderr)
    res.update(cell=cell, margin=margin, where=where, detail=detail, certify_rc=p.returncode,
               report=os.path.join(out, "certify.txt"), lr=lr_line(p.stdout + p.stderr))
    return res


def lr_line(report):
    """certify's lr channel's FAIL line (what the lr sequence is), or ''."""
    m = re.search(r"^FAIL lr: (.*)$", report, re.M)
    return m.group(1) if m else ""


def agrees(res):
    """The cell against the row's expectation: PASS, the named pitfall
    (the expectation names the pitfall id the diagnosis must start with),
    or no-modelled-pitfall (what the sources say the version does is a loop
    no catalog pitfall models: certify's honest 'no modelled pitfall'), or
    lr:WORDS (the lr channel FAILs saying WORDS, dashes for spaces: e.g.
    lr:linear-scaling-rule for an lr x K, whatever the diagnosis)."""
    want, got = res["expect"], res["cell"]
    if want.startswith("lr:"):
        return bool(want[3:]) and want[3:].replace("-", " ") in res.get("lr", "")
    if want == "PASS":
        return got == "PASS"
    if want == "no-modelled-pitfall":
        return got == "no modelled pitfall"
    if want == "case-failed":
        # The release lacks what the case uses (an option it never had):
        # the user's script fails there, before any trace.
        return got.startswith("case failed")
    # A combination is a set of pitfalls: the release's sources say which,
    # not the order certify lists them in.  Where the weights and the lr
    # match different candidates (parse), the set is both channels'; an lr
    # no modelled pitfall explains agrees with no pitfall named.
    names = got.split(" ")[0].rstrip(",").split("+")
    lr = re.match(r"[^ ]+, lr: (.*) \(fit [^)]*\)$", got)
    if lr:
        if lr.group(1) == "no modelled pitfall":
            return False
        names += lr.group(1).split("+")
    return sorted(set(names)) == sorted(set(want.split("+")))


def table(results, installs):
    lines = ["| framework | version | case | cell | margin | worst step, micro-batch | "
             "evidence | public reports say | CPU s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        cell = r["cell"] + (" (the recorder changed the run)"
                            if r.get("identity", "").startswith("DIFFERS") else "")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["framework"], r["version"], r["case"], cell, r["margin"], r["where"],
            r["detail"].replace("|", "/"), r["expect"], r["cpu_s"]))
    for spec, err in installs:
        lines.append("| %s | %s | all | cannot run: %s | | | | | |" % (
            spec.split("==")[0], spec.split("==")[1], err.replace("|", "/")[:300]))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("venv", help="make or reuse a framework venv; prints its python")
    v.add_argument("spec", help="framework==version")
    sub.add_parser("list", help="the CI subset's cells, one 'framework==version case' a line (CTest)")
    r = sub.add_parser("run", help="the matrix")
    r.add_argument("--ci", action="store_true", help="only the rows marked ci")
    r.add_argument("--only", action="append", help="framework (repeatable)")
    r.add_argument("--case", action="append", help="case (repeatable)")
    r.add_argument("--spec", action="append", help="framework==version (repeatable)")
    r.add_argument("--table", help="write the Markdown table here")
    r.add_argument("--json", help="write the results here")
    r.add_argument("-j", "--jobs", type=int, default=2,
                   help="rows at a time (a venv made or a row's cells run each; default 2)")
    t = sub.add_parser("table", help="one Markdown table from the --json files of several runs")
    t.add_argument("json", nargs="+")
    c = sub.add_parser("check", help="cells of one venv against versions.txt's expectations, in "
                       "one process (exit 0 iff every one agrees)")
    c.add_argument("spec")
    c.add_argument("case", nargs="+")
    c.add_argument("--variant", default="default")
    c.add_argument("--identity", nargs="*", metavar="CASE",
                   help="also run these cases (all given, when none is named) without the "
                   "recorder, in their process: the trained parameters must be the same bits")
    a = ap.parse_args()
    _adopt_orphans()
    if a.cmd == "venv":
        py, spent, err = venv(row_of(a.spec))
        if err:
            print(err, file=sys.stderr)
            return 2
        print(py)
        if spent:
            print("venv: made in %.1f s" % spent, file=sys.stderr)
        return 0
    if a.cmd == "table":
        results, installs = [], []
        for path in a.json:
            with open(path) as f:
                got = json.load(f)
            for r in got["results"]:
                # Re-read certify's report where it is still there (the
                # parse may have been improved since the run): the run's
                # own report, never this checkout's work folder (another
                # run's, perhaps older).
                txt = r.get("report", "")
                if "certify_rc" in r and txt and os.path.exists(txt):
                    with open(txt) as f:
                        r["cell"], r["margin"], r["where"], r["detail"] = parse(r["certify_rc"],
                                                                                f.read())
                # A run from before its case declared variants: its
                # default is the first; the expectation is today's row's.
                variants = variants_of(os.path.join(CASES, "%s_%s.py" % (r["framework"],
                                                                        r["case"].split(".")[0])))
                if variants and "." not in r["case"]:
                    r["case"] = "%s.%s" % (r["case"], variants[0])
                r["expect"] = row_of("%s==%s" % (r["framework"], r["version"]))["expect"].get(
                    r["case"], "PASS")
                results.append(r)
            installs += [tuple(x) for x in got["cannot_run"]]
        order = {r["spec"]: i for i, r in enumerate(read_versions())}
        results.sort(key=lambda r: (order.get("%s==%s" % (r["framework"], r["version"]), 0), r["case"]))
        print(table(results, installs), end="")
        return 0
    if a.cmd == "list":
        for row in read_versions():
            if row["ci"]:
                for case in cases_of(row["framework"]):
                    if row["ci"] is True or case in row["ci"]:
                        print(row["spec"], case)
        return 0
    if a.cmd == "check":
        row = row_of(a.spec)
        if _jax_based(row) and not os.access(os.path.join(ROOT, ".venv-jax", "bin", "python"), os.X_OK):
            # Not this cell's failure: the base it is layered on is not made.
            print("%s: no .venv-jax (bash scripts/venv-jax.sh makes it)" % a.spec)
            return 77
        py, spent, err, pending = venv(row, quiet=True, defer=True)
        if err:
            # Not this project's failure: the framework's pins cannot be
            # installed here (no registry, or no release for torch 2.13).
            print("%s: cannot make its venv: %s" % (a.spec, err))
            return 77
        compared = a.case if a.identity == [] else a.identity or []
        stray = [c for c in compared if c not in a.case]
        if stray:
            print("check: --identity %s: not among the cases given (%s)" % (
                " ".join(stray), " ".join(a.case)), file=sys.stderr)
            return 2
        said = {}

        def imported(got):
            """A venv made now: judged by the imports of the cells' process."""
            said["err"] = imported_venv(row, pending, got)
            return said["err"] is None
        results = run_cases(row, a.case, py, a.variant, identity=compared,
                            imported=imported if pending else None)
        if results is None:
            print("%s: cannot make its venv: %s" % (a.spec, said["err"]))
            return 77
        print("venv %s: %.1f s making it" % (a.spec, spent))
        failed = 0
        for case, res in zip(a.case, results):
            print(json.dumps(res, indent=1))
            ok = agrees(res)
            print("%s: %s %s: %s (expected %s), case %.1f s CPU" % (
                "ok" if ok else "DISAGREES", a.spec, case, res["cell"], res["expect"],
                res["cpu_s"]))
            # A run that exited 0 must say bit-identical (a refused one has
            # no recorded run to compare).
            same = "identity" not in res and res["cell"].startswith("refused") or \
                res.get("identity") == "bit-identical"
            if case in compared:
                print("%s: %s %s: trained parameters with and without the recorder: %s" % (
                    "ok" if same else "DIFFERS", a.spec, case,
                    res.get("identity", "the case did not finish")))
            failed += not (ok and (same or case not in compared))
        print("%s %s: %d of %d cells agree" % (a.spec, "ok" if not failed else "FAILED",
                                              len(a.case) - failed, len(a.case)))
        return 0 if not failed else 1
    t0 = time.time()
    rows = [row for row in read_versions()
            if not ((a.ci and not row["ci"]) or (a.only and row["framework"] not in a.only)
                    or (a.spec and row["spec"] not in a.spec))]
    results, installs, lock = [], [], threading.Lock()

    def say(res):
        with lock:
            print("%-28s %-8s %-40s %s %s  [%s s CPU, %s]%s" % (
                "%s==%s" % (res["framework"], res["version"]), res["case"], res["cell"],
                res["margin"], res["where"], res["cpu_s"], res.get("identity", "no recorded run"),
                "" if agrees(res) else "  (public reports: %s)" % res["expect"]),
                file=sys.stderr, flush=True)

    def one(row):
        """A row: its venv (made if missing), then its cells in one process."""
        py, spent, err = venv(row)
        if err:
            with lock:
                print("%s: %s" % (row["spec"], err), file=sys.stderr)
                finished.append((row, spent, err, []))
            return row, spent, err, []
        cases = cases_of(row["framework"], a.case)
        if row["cells"]:
            cases = [c for c in cases if c in row["cells"] or c.split(".")[0] in row["cells"]]
        if a.ci and row["ci"] is not True:
            cases = [c for c in cases if c in row["ci"]]
        # The JAX-side cases compare with and without the recorder in their
        # own tests (JAX.unit, bench/keras_contract_bench.py), not here.
        got = run_cases(row, cases, py, report=say)
        if got:
            got[0]["venv_s"] = round(spent, 1)
        with lock:
            finished.append((row, spent, err, got))
            if a.json:  # so far: a run stopped early keeps the rows it made
                write_json(finished, partial=True)
        return row, spent, err, got

    def write_json(rows_done, partial):
        with open(a.json + ".tmp", "w") as f:
            json.dump({"results": [r for _, _, _, got in rows_done for r in got],
                       "cannot_run": [(row["spec"], err) for row, _, err, _ in rows_done if err],
                       "wall_s": round(time.time() - t0, 1), "jobs": a.jobs,
                       "venv_s": round(sum(x[1] for x in rows_done), 1),
                       "load": os.getloadavg(), "partial": partial}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)

    finished = []

    # -j rows at a time: one row's pip and another's training overlap.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        done = list(pool.map(one, rows))
    for row, spent, err, got in done:
        if err:
            installs.append((row["spec"], err))
        results += got
    venv_s = sum(spent for _, spent, _, _ in done)
    md = table(results, installs)
    print(md)
    said = [r.get("identity", "no recorded run") for r in results]
    print("trained parameters with and without the recorder: %d bit-identical, %d differ, "
          "%d not compared, %d cells without a finished run" % (
              said.count("bit-identical"), sum(x.startswith("DIFFERS") for x in said),
              said.count("not compared"), said.count("no recorded run")), file=sys.stderr)
    if a.table:
        with open(a.table, "w") as f:
            f.write(md)
    if a.json:
        write_json(done, partial=False)
    print("matrix: %.1f s wall, -j %d, %d cells (%.1f s CPU), venvs made in %.1f s, load %s"
          % (time.time() - t0, a.jobs, len(results), sum(r["cpu_s"] for r in results), venv_s,
             " ".join("%.2f" % x for x in os.getloadavg())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
