"""The cells of one framework venv in one process (bench/conformance.py
runs it with the venv's python): torch, the framework and accumcheck_torch
are imported once, then each cell is a fork of this process that runs its
case file as a script would (runpy, __name__ == "__main__", its own
sys.argv, stdout and stderr into the cell's case.log) and exits as a
script does (atexit handlers, files flushed; not the teardown of every
module).  A
cell then costs its training, not the 3 to 10 s of CPU of a fresh
interpreter importing torch and a framework.

    python cells.py CASES_DIR FRAMEWORK TIMEOUT_S < cells.jsonl

Each input line: {"case": CASE, "script": FILE, "argv": [...], "log": FILE}.
The first output line, before any cell: {"imported": how torch (or jax)
and the framework imported} (warm()).  Each output line after it, as its
cell ends: {"case": CASE, "rc": exit status,
"cpu_s": the cell's CPU seconds (its own and its waited-for children's),
"wall_s": ...}.  A signal's death reads as rc -SIGNAL (timeout: -14)."""

import atexit
import gc
import importlib
import importlib.metadata
import importlib.util
import io
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings

# What each framework's cases import (more than `import FRAMEWORK` where
# the framework imports its training loop lazily); an import that fails
# here is left to the cell, which reports it itself.
WARM = {
    "transformers": ["transformers", "transformers.trainer",
                     "transformers.models.llama.modeling_llama",
                     "accumcheck_torch.integrations.transformers"],
    "accelerate": ["accelerate", "accumcheck_torch.integrations.accelerate"],
    "lightning": ["lightning", "lightning.pytorch", "accumcheck_torch.integrations.lightning"],
}


JAX_BASED = ("optax", "flax", "keras")

# Frameworks whose import fixes a choice each cell makes for itself: Keras
# reads KERAS_BACKEND once, at its import, and a keras row's cells run on
# the JAX backend and on torch's (torch_*, tests/frameworks/keras_fit.py
# sets it in the forked cell).  The parent finds it and reads its version
# without importing it; each cell imports it.
IMPORTED_PER_CELL = ("keras",)


def warm(framework):
    """Imports what the framework's cells share, in this (the parent)
    process: jax and accumcheck_jax for the JAX-side frameworks (their
    venvs are layered on .venv-jax), torch and accumcheck_torch for the
    rest.  Returns what bench/conformance.py's import check of a new venv
    asks (its "imported" line): {"ok": torch (or jax) and the framework
    imported, "version": torch's (the framework's, JAX-based), "error": the
    first failed import's last line}."""
    said = {"ok": True, "version": "", "error": ""}
    first = ["jax"] if framework in JAX_BASED else ["torch"]
    module = framework.replace("-", "_")
    for name in first + [module]:
        if name == module and framework in IMPORTED_PER_CELL:
            if importlib.util.find_spec(name) is None:
                said.update(ok=False, error="ModuleNotFoundError: No module named '%s'" % name)
                break
            said["version"] = importlib.metadata.version(name)
            continue
        try:
            m = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 -- the check's failure; the cell meets it too
            said.update(ok=False, error=traceback.format_exception_only(e)[-1].strip())
            break
        if name == (module if framework in JAX_BASED else "torch"):
            said["version"] = str(getattr(m, "__version__", ""))
    base = ["accumcheck_jax"] if framework in JAX_BASED else ["accumcheck_torch"]
    shared = [] if framework in IMPORTED_PER_CELL else WARM.get(framework, [module])
    for name in base + shared:
        try:
            importlib.import_module(name)
        except Exception:  # the cell meets it again and says so
            pass
    return said


def _adopt_orphans():
    """Adopts descendants' orphans (PR_SET_CHILD_SUBREAPER), as
    bench/conformance.py does: a rank its framework launched and never
    waited for is reaped here and counted."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def serve(timeout_s):
    """Forks one child per input line; returns (in the child) the cell to
    run, or None (in the parent, when the input ends)."""
    for line in sys.stdin:
        if not line.strip():
            continue
        cell = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.time()
        pid = os.fork()
        if pid == 0:
            return cell
        _, status, usage = os.wait4(pid, 0)
        # Orphans adopted from the cell (ranks it started and left): theirs
        # is the cell's time too.
        extra = 0.0
        while True:
            try:
                opid, _, ousage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if opid == 0:
                time.sleep(0.05)
                if time.time() - t0 > timeout_s + 60:
                    break
                continue
            extra += ousage.ru_utime + ousage.ru_stime
        rc = os.waitstatus_to_exitcode(status)
        print(json.dumps({"case": cell["case"], "rc": rc,
                          "cpu_s": round(usage.ru_utime + usage.ru_stime + extra, 2),
                          "wall_s": round(time.time() - t0, 2)}), flush=True)
    return None


def run_cell(cell, timeout_s):
    """In the forked child: the case file as `python FILE ARGV...` would
    run it; returns its exit status."""
    fd = os.open(cell["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdin = open(os.devnull)
    signal.alarm(int(timeout_s))
    sys.argv = [cell["script"]] + cell["argv"]
    sys.path[0] = os.path.dirname(cell["script"])
    try:
        runpy.run_path(cell["script"], run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


def main():
    cases, framework, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    sys.path.insert(0, cases)
    _adopt_orphans()
    # First, before any cell: how the imports went (a venv made now is
    # judged on it).
    print(json.dumps({"imported": warm(framework)}), flush=True)
    # What the imports made (a few hundred thousand objects with torch and
    # Transformers) is left out of every garbage collection from here on,
    # the cells' included: each full collection walked them all (0.9 s of
    # CPU each time a Trainer's Accelerator calls gc.collect(), and the
    # interpreter's own generation-2 collections while a cell trains).
    # What a cell makes is collected as before.
    gc.freeze()
    cell = serve(timeout_s)
    if cell is None:
        return 0
    try:
        code = run_cell(cell, timeout_s)
    except BaseException:  # the traceback and exit 1, as a script's
        traceback.print_exc()
        code = 1
    leave(code)


def leave(code):
    """Ends the cell as the interpreter's exit would, minus tearing down
    every module (a second of CPU with torch loaded, for nothing): the
    non-daemon threads joined, the atexit handlers run (the recorders
    close there), every open file flushed, then os._exit."""
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        warnings.simplefilter("ignore")  # isinstance on a deprecated alias warns
        for f in gc.get_objects():
            if isinstance(f, io.IOBase):
                try:
                    if not f.closed and f.writable():
                        f.flush()
                except Exception:  # as the interpreter's own flush at exit
                    pass
        for f in (sys.stdout, sys.stderr):
            if f is not None:
                f.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
