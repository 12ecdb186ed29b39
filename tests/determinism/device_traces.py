#!/usr/bin/env python3
"""The float32 engine gives the same bits on every x86-64 CPU.

Runs `accumcheck run SCENARIO --engine device` and compares the traces it
writes (docs/engines-and-numerics.md states the guarantee):

  golden      every scenario in scenarios/, under this machine's default
              matrix-product path: the digest of each trace's numbers
              (events.csv, values.csv, state.csv) must be the one committed
              in tests/determinism/device-trace-digests.txt, so a machine
              with another CPU is checked against the one that wrote it;
              then, under every vector path of the matrix product this CPU
              can run (ACCUMCHECK_MATMUL_PATH: generic, avx2, avx512; the
              path is what differs from CPU to CPU), scenarios that use
              every kernel body must write the same trace folders byte for
              byte.
  coretypes   under each kernel the installed OpenBLAS can be forced to
              (OPENBLAS_CORETYPE; what OpenBLAS reports it chose is
              printed), three scenarios (an MLP, BatchNorm, the token
              model) must write byte-identical trace folders: the engine
              uses no BLAS, and this keeps it so.  Where the dynamic
              loader (LD_DEBUG=libs) initializes no BLAS or LAPACK library
              in those runs, no kernel can reach them: the first kernel
              OpenBLAS can be forced to stands for all (each repeat of ~19
              proved nothing more); where one is loaded, every kernel is
              run.  Exit 77 (CTest: skipped) where no libopenblas.so.0 is
              installed.

Usage: device_traces.py MODE --accumcheck BIN --repo DIR --work DIR [--update]
--update (golden) rewrites the digest file from this machine's traces:
for a change that is meant to change the engine's digits.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys

SKIP = 77
DIGESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device-trace-digests.txt")
NUMBERS = ("events.csv", "values.csv", "state.csv")
# Every kernel body: gelu/cross-entropy/Adam/clip (correct), tanh/mse/SGD,
# relu, BatchNorm, LayerNorm, GroupNorm, dropout, the token model
# (embedding), bf16 and fp16 gradient buffers, 2 ranks, AdamW, cosine.
COVERING = (
    "correct", "zero-grad-every-micro-step", "scheduler-per-micro-step",
    "certify-batchnorm", "certify-layernorm", "certify-groupnorm",
    "dropout-sample-keyed", "token-mean-of-means", "low-precision-grad-buffer",
    "mixed-precision-correct", "ddp-correct", "certify-adamw",
)
CORE_SET = ("correct", "certify-batchnorm", "token-mean-of-means")
# OpenBLAS 0.3's DYNAMIC_ARCH core names (driver/others/dynamic.c); those
# the library reports back unchanged are kernels it can be forced to.
CORE_NAMES = (
    "Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom",
    "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron",
    "Opteron_SSE3", "Barcelona", "Nano", "Sandybridge", "Bulldozer",
    "Piledriver", "Haswell", "Steamroller", "Excavator", "Zen", "SkylakeX",
    "Cooperlake", "SapphireRapids",
)


def run_all(args, names: list[str], dest: str, env_extra: dict[str, str]) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    env = dict(os.environ, **env_extra)
    for name in names:
        scenario = os.path.join(args.repo, "scenarios", name + ".toml")
        proc = subprocess.run([args.accumcheck, "run", scenario, "--engine", "device", "--quiet",
                               "--out", os.path.join(dest, name)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            sys.exit(f"{name} ({env_extra or 'default'}): accumcheck run exited "
                     f"{proc.returncode}:\n{proc.stdout.decode(errors='replace')}")


def folder_bytes(folder: str) -> dict[str, bytes]:
    out = {}
    for f in sorted(os.listdir(folder)):
        with open(os.path.join(folder, f), "rb") as fh:
            out[f] = fh.read()
    return out


def numbers_digest(folder: str) -> str:
    h = hashlib.sha256()
    for f in NUMBERS:
        p = os.path.join(folder, f)
        if os.path.exists(p):
            with open(p, "rb") as fh:
                data = fh.read()
            h.update(f"{f} {len(data)}\n".encode())
            h.update(data)
    return h.hexdigest()


def compare(base: str, other: str, names: list[str], label: str) -> int:
    bad = 0
    for name in names:
        a, b = folder_bytes(os.path.join(base, name)), folder_bytes(os.path.join(other, name))
        if a != b:
            files = sorted(f for f in set(a) | set(b) if a.get(f) != b.get(f))
            print(f"FAIL: {label}: {name}: {', '.join(files)} differ from the default run's")
            bad += 1
    return bad


def scenario_names(repo: str) -> list[str]:
    return sorted(f[:-5] for f in os.listdir(os.path.join(repo, "scenarios")) if f.endswith(".toml"))


def available_paths(args) -> list[str]:
    # The paths this CPU runs: each one is tried (an unsupported one exits 2).
    probe = os.path.join(args.repo, "scenarios", "correct.toml")
    paths = []
    for p in ("generic", "avx2", "avx512"):
        proc = subprocess.run([args.accumcheck, "run", probe, "--engine", "device", "--no-trace",
                               "--quiet", "--steps", "1"],
                              env=dict(os.environ, ACCUMCHECK_MATMUL_PATH=p),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode == 0:
            paths.append(p)
        elif b"this CPU cannot run it" not in proc.stdout:
            sys.exit(f"ACCUMCHECK_MATMUL_PATH={p}: {proc.stdout.decode(errors='replace')}")
    return paths


def golden(args) -> int:
    names = scenario_names(args.repo)
    base = os.path.join(args.work, "default")
    run_all(args, names, base, {})
    digests = {n: numbers_digest(os.path.join(base, n)) for n in names}
    if args.update:
        with open(DIGESTS, "w") as f:
            f.write("# sha256 of each scenario's device trace numbers (events.csv, values.csv,\n"
                    "# state.csv): tests/determinism/device_traces.py golden --update\n")
            for n in names:
                f.write(f"{digests[n]}  {n}\n")
        print(f"wrote {len(names)} digests to {DIGESTS}")
        return 0
    want = {}
    with open(DIGESTS) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                d, n = line.split()
                want[n] = d
    bad = 0
    for n in names:
        if n not in want:
            print(f"FAIL: {n}: no committed digest (device_traces.py golden --update)")
            bad += 1
        elif want[n] != digests[n]:
            print(f"FAIL: {n}: trace numbers differ from the committed digest")
            bad += 1
    for n in sorted(set(want) - set(names)):
        print(f"FAIL: {n}: a committed digest for a scenario that is gone")
        bad += 1
    print(f"golden: {len(names) - bad} of {len(names)} scenarios' traces match the committed digests")
    for p in available_paths(args):
        other = os.path.join(args.work, "path-" + p)
        run_all(args, list(COVERING), other, {"ACCUMCHECK_MATMUL_PATH": p})
        b = compare(base, other, list(COVERING), f"ACCUMCHECK_MATMUL_PATH={p}")
        print(f"matrix-product path {p}: {len(COVERING) - b} of {len(COVERING)} trace folders "
              f"byte-identical to the default run's")
        bad += b
    return 1 if bad else 0


def forced_core(core: str) -> str:
    code = ("import ctypes; lib = ctypes.CDLL('libopenblas.so.0'); "
            "lib.openblas_get_corename.restype = ctypes.c_char_p; "
            "print(lib.openblas_get_corename().decode())")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OPENBLAS_CORETYPE=core),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
    return proc.stdout.decode().strip()


def loaded_blas(args, names: list[str]) -> set[str]:
    """The BLAS and LAPACK libraries the dynamic loader initializes in
    `accumcheck run` of each scenario (LD_DEBUG=libs: linked or dlopened)."""
    found = set()
    scratch = os.path.join(args.work, "ld-debug")
    for name in names:
        scenario = os.path.join(args.repo, "scenarios", name + ".toml")
        proc = subprocess.run([args.accumcheck, "run", scenario, "--engine", "device", "--quiet",
                               "--out", os.path.join(scratch, name)],
                              env=dict(os.environ, LD_DEBUG="libs"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = proc.stdout.decode(errors="replace")
        if proc.returncode != 0 or "calling init:" not in out:
            sys.exit(f"{name} (LD_DEBUG=libs): accumcheck run exited {proc.returncode}, or the "
                     f"loader said nothing:\n{out[-3000:]}")
        for line in out.splitlines():
            lib = line.rsplit("calling init: ", 1)[-1] if "calling init: " in line else ""
            if any(k in os.path.basename(lib) for k in ("blas", "lapack")):
                found.add(os.path.basename(lib))
    shutil.rmtree(scratch, ignore_errors=True)
    return found


def coretypes(args) -> int:
    try:
        ctypes.CDLL("libopenblas.so.0")
    except OSError as e:
        print(f"skipped: no OpenBLAS installed to force ({e})")
        return SKIP
    # Whether any BLAS is in accumcheck's process at all, for these runs
    # (the dynamic loader's own account, dlopen included): where none is,
    # no OPENBLAS_CORETYPE can reach the engine, and a repeat under each
    # of the ~19 kernels proves nothing one forced kernel does not.
    blas = loaded_blas(args, list(CORE_SET))
    kernels = []
    for core in CORE_NAMES:
        chose = forced_core(core)
        print(f"OPENBLAS_CORETYPE={core}: OpenBLAS chose {chose}")
        if chose == core:
            kernels.append(core)
            if not blas:
                break
    if blas:
        print(f"accumcheck loads {' '.join(sorted(blas))}: every kernel OpenBLAS can be forced to")
    else:
        print("accumcheck loads no BLAS library (LD_DEBUG=libs): the first kernel OpenBLAS can be "
              "forced to stands for all of them")
    base = os.path.join(args.work, "default")
    run_all(args, list(CORE_SET), base, {})
    bad = 0
    for core in kernels:
        other = os.path.join(args.work, "core-" + core)
        run_all(args, list(CORE_SET), other, {"OPENBLAS_CORETYPE": core})
        bad += compare(base, other, list(CORE_SET), f"OPENBLAS_CORETYPE={core}")
        shutil.rmtree(other)
    print(f"coretypes: {len(CORE_SET)} scenarios under {len(kernels)} OpenBLAS kernels "
          f"({' '.join(kernels)}): {'all byte-identical' if not bad else f'{bad} differ'}")
    return 1 if bad or not kernels else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("golden", "coretypes"))
    parser.add_argument("--accumcheck", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--update", action="store_true")
    args = parser.parse_args()
    args.work = os.path.join(os.path.abspath(args.work), args.mode)
    os.makedirs(args.work, exist_ok=True)
    return golden(args) if args.mode == "golden" else coretypes(args)


if __name__ == "__main__":
    sys.exit(main())
