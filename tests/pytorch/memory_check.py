#!/usr/bin/python3
"""accumcheck memory against PyTorch's own CPU allocations (CTest Memory.*).

  memory_check.py --accumcheck BIN --memtrack libaccumcheck_memtrack.so \\
      --scenario S.toml --b 8 [--b 32 ...] --k 4 --work DIR

Exports the scenario (so PyTorch builds exactly accumcheck's model and
optimizer, through accumcheck_torch.load_bundle), asks `accumcheck memory
--kv` for its prediction, and measures the same quantities in a child
Python under LD_PRELOAD=memtrack (tests/pytorch/memtrack.cpp: the bytes
c10's CPU allocator holds, block by block):

  params       live bytes after building the model and the optimizer
  grads        after the first window's zero_grad(set_to_none=False): the
               buffer accumulation keeps

  states       what the first optimizer.step() allocated
  data         one micro-batch's x and y
  activations  live bytes after a forward minus before it (steady state)
  peak         the maximum live bytes over the second (steady) window

The same run with PyTorch 2's default zero_grad() (set_to_none=True, the
gradients freed between windows) must measure the same peak and no
gradient at rest: accumulation's buffer lives through the window, where
the peak is, either way.  Each --b is measured so, one after the other,
in the one child (a measurement counts from the live bytes before it, and
builds its own model and optimizer): one interpreter importing torch per
scenario, not one per micro-batch size.

Tolerance: 0 bytes for every quantity.  The allocator hands out exactly
the requested bytes of each storage, and each prediction is a sum of
storage sizes (numel x element size), so any difference is a tensor the
model misses or invents, not noise.  (Single-threaded, so no per-thread
scratch.)  Prints the row and "driver: ok" when every quantity matches.

Under scripts/check-hardened.sh (ACCUMCHECK_RECORDED_BUILD and
ACCUMCHECK_THIS_BUILD, as tests/pytorch/ctest_driver.py's recorded_run)
the measurement that scripts/test.sh's run of this test wrote
(DIR/measured.txt in build/) is taken instead of measuring again, when the
bundle it measured is byte for byte the one the sanitized accumcheck
exported here and it is newer than every Python file of the package and
these drivers and than that build's memtrack: the child is the same
Python program either way, what the sanitizers watch is accumcheck's
export and memory.
"""
import argparse
import ctypes
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ctest_driver  # in_recorded_build, same_files

KEYS = ["params", "grads", "states", "data", "activations", "peak"]


def measure(bundle_dir, b, K, set_to_none):
    import torch
    from accumcheck_torch import load_bundle

    torch.set_num_threads(1)
    lib = ctypes.CDLL(None)
    lib.memtrack_live.restype = ctypes.c_uint64
    lib.memtrack_peak.restype = ctypes.c_uint64
    bundle = load_bundle(bundle_dir)
    gen = torch.Generator().manual_seed(0)

    def batch():
        x = torch.randn(b, bundle.widths[0], generator=gen)
        if bundle.loss_kind == "mse":
            y = torch.randn(b, bundle.widths[-1], generator=gen)
        else:
            y = torch.randint(0, bundle.widths[-1], (b,), generator=gen)
        return x, y

    # Warm-up, untracked: some kernels (GELU here) allocate a one-time
    # cache on their first call that lives for the process; it is not
    # training memory and is not counted.
    warm = bundle.model()
    x, y = batch()
    (bundle.loss_mean(warm(x), y) / K).backward()
    bundle.optimizer(warm).step()
    del warm, x, y

    lib.memtrack_enable(1)
    base = lib.memtrack_live()  # blocks of an earlier measurement still live (none expected)
    model = bundle.model()
    optimizer = bundle.optimizer(model)
    m = {"params": lib.memtrack_live() - base}
    for window in range(2):
        if window == 1:
            lib.memtrack_reset_peak()
        for k in range(K):
            before = lib.memtrack_live()
            x, y = batch()
            with_data = lib.memtrack_live()
            out = model(x)
            loss = bundle.loss_mean(out, y) / K
            del out
            if window == 1 and k == 0:
                m["data"] = with_data - before
                m["activations"] = lib.memtrack_live() - with_data
            loss.backward()
            del loss, x, y
        before_step = lib.memtrack_live()
        optimizer.step()
        if window == 0:
            m["states"] = lib.memtrack_live() - before_step
        optimizer.zero_grad(set_to_none=set_to_none)
        if window == 0:
            m["grads"] = lib.memtrack_live() - base - m["params"] - m["states"]
    m["peak"] = lib.memtrack_peak() - base
    lib.memtrack_enable(0)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accumcheck")
    ap.add_argument("--memtrack")
    ap.add_argument("--scenario")
    ap.add_argument("--b", type=int, action="append", required=True,
                    help="micro-batch size (repeatable: each measured)")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--work")
    ap.add_argument("--measure", help="(child) bundle folder to measure")
    a = ap.parse_args()
    if a.measure:
        # One child measures every b, each twice: set_to_none=False, then True.
        for b in a.b:
            for set_to_none in (False, True):
                m = measure(a.measure, b, a.k, set_to_none)
                print(" ".join(f"{k}={m[k]}" for k in KEYS))
        return 0
    os.makedirs(a.work, exist_ok=True)
    bundle = os.path.join(a.work, "bundle")
    subprocess.run([a.accumcheck, "export", a.scenario, "--out", bundle, "--quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    preds = []
    for b in a.b:
        kv = subprocess.run([a.accumcheck, "memory", a.scenario, "--b", str(b),
                             "--k", str(a.k), "--kv"], check=True, text=True,
                            capture_output=True).stdout
        preds.append({line.split()[0]: int(line.split()[1]) for line in kv.splitlines()})
    measured = os.path.join(a.work, "measured.txt")
    recorded = measured_before(a.work, bundle, a.memtrack, measured_key(a))
    if recorded:
        print(f"driver: the measurement {os.environ['ACCUMCHECK_RECORDED_BUILD']}'s run took "
              "(the same bundle, byte for byte)")
        with open(recorded) as f:
            lines = f.read().splitlines()[1:]
    else:
        env = dict(os.environ, LD_PRELOAD=a.memtrack, OMP_NUM_THREADS="1")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", bundle,
                            "--k", str(a.k)] + [f"--b={b}" for b in a.b], env=env, text=True,
                           capture_output=True)
        lines = r.stdout.splitlines()
        if r.returncode != 0 or len(lines) != 2 * len(a.b):
            print(r.stdout + r.stderr)
            return 1
        with open(measured, "w") as f:
            f.write("\n".join([measured_key(a)] + lines) + "\n")
    bad = 0
    name = os.path.splitext(os.path.basename(a.scenario))[0]
    for i, (b, pred) in enumerate(zip(a.b, preds)):
        meas, none = (dict(kv.split("=") for kv in line.split()) for line in lines[2 * i:2 * i + 2])
        print(f"{'quantity':<12} {'predicted':>12} {'measured':>12}  ({name}, b={b}, K={a.k})")
        for k in KEYS:
            p, m = pred[k], int(meas[k])
            ok = p == m
            bad += not ok
            print(f"{k:<12} {p:>12} {m:>12}  {'ok' if ok else 'DIFFERS by ' + str(m - p)}")
        for k, want in (("peak", pred["peak"]), ("grads", 0)):
            m = int(none[k])
            ok = m == want
            bad += not ok
            print(f"{k + ' (none)':<12} {want:>12} {m:>12}  "
                  f"{'ok' if ok else 'DIFFERS by ' + str(m - want)}  zero_grad(set_to_none=True)")
    if bad:
        print(f"driver: {bad} quantities differ (tolerance 0 bytes)")
        return 1
    print("driver: ok")
    return 0


def measured_key(a):
    """measured.txt's first line: what else the child was given."""
    return "b=%s k=%d" % (",".join(map(str, a.b)), a.k)


def measured_before(work, bundle, memtrack, key):
    """The recorded build's measured.txt for this test (see the module's
    docstring), or None."""
    path = ctest_driver.in_recorded_build(work)
    shim = ctest_driver.in_recorded_build(memtrack)
    if not path or not shim:
        return None
    measured = os.path.join(path, "measured.txt")
    other = os.path.join(path, "bundle")
    if not (os.path.isfile(measured) and os.path.isfile(shim) and os.path.isdir(other)
            and ctest_driver.same_files(bundle, other)):
        return None
    with open(measured) as f:
        if f.readline().strip() != key:
            return None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    newest = max([os.path.getmtime(shim)] + [
        os.path.getmtime(os.path.join(d, f))
        for top in ("python", os.path.join("tests", "pytorch"))
        for d, _, files in os.walk(os.path.join(root, top)) for f in files if f.endswith(".py")])
    return measured if os.path.getmtime(measured) > newest else None


if __name__ == "__main__":
    sys.exit(main())
