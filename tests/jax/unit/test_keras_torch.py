"""KerasRecorder on Keras's torch backend: the output path records each
train step with no forward of its own (the step's forward is the only
one), the trained weights bit-identical with and without it; where its
premise fails (a kernel_regularizer: Keras's loss adds a penalty that
reaches the parameters directly) or cannot be checked (Dropout: no
float64 clone), the full path records, with a note in meta.csv.

The fits run in one child process on KERAS_BACKEND=torch (Keras fixes
its backend at its import; this process imports it on jax)."""

import csv
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

# oracle/error_model.hpp evidence_weight_rel: the precision certify reads
# a weight to (outputs.EVIDENCE_WEIGHT_REL, the premise's bound).
from accumcheck_jax.outputs import EVIDENCE_WEIGHT_REL  # noqa: E402

CHILD = r"""
import json, os, sys
import numpy as np
import train_keras, torch
out, cases = sys.argv[1], sys.argv[2:]
seen = {}
for case in cases:
    for record in (False, True):
        calls = [0]
        build = train_keras.build

        def counted(args):
            model = build(args)
            model.register_forward_hook(lambda m, a, o: calls.__setitem__(0, calls[0] + 1))
            return model
        train_keras.build = counted
        try:
            argv = ["--case", case, "--quiet"]
            argv += ["--out", os.path.join(out, case)] if record else ["--no-record"]
            w = train_keras.main(argv)
        finally:
            train_keras.build = build
        np.savez(os.path.join(out, "%s-%d.npz" % (case, record)), *w)
        seen["%s-%d" % (case, record)] = calls[0]
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch")
    env = dict(os.environ, KERAS_BACKEND="torch")
    r = subprocess.run([sys.executable, "-c", CHILD, str(out), "fit", "l2", "l2_share", "dropout"],
                       capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return out, json.loads(r.stdout.strip().splitlines()[-1])


def same_bits(out, case):
    import numpy as np
    a, b = np.load(out / ("%s-0.npz" % case)), np.load(out / ("%s-1.npz" % case))
    assert len(a.files) == len(b.files)
    for k in a.files:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))


def meta(folder):
    with open(folder / "meta.csv") as f:
        return dict(csv.reader(f))


def backward_residuals(folder):
    with open(folder / "contract.csv") as f:
        return [float(r["residual"]) for r in csv.DictReader(f) if r["kind"] == "backward"]


# The correct fit on the output path: the model's forward called once per
# train step with the recorder as without it (the full path's own forward
# would add one a step), nothing noted, and the trace PASSes.
def test_output_path_has_no_forward_of_its_own(fits, certify):
    out, calls = fits
    same_bits(out, "fit")
    assert calls["fit-1"] == calls["fit-0"], calls
    assert "notes" not in meta(out / "fit")
    r = certify(out / "fit")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS (contract tier)" in r.stdout


# An L2 kernel_regularizer: Keras's loss adds the penalty, whose gradient
# reaches the hidden kernel directly, so c_j is not the outputs' cotangent
# carried back: the premise fails at micro-batch 0 (the first calibration
# sample) and every step takes the full path, whose fit against the
# declared summed loss's own gradient shows the penalty (residuals past
# the precision certify reads a weight to).  certify names it: the
# declared summed_loss is not the loss Keras differentiates (the penalty
# is not in it).  Read at the outputs instead, every residual would be
# that of u_j = w_j s_j (about 1e-7) and the penalty unseen.
def test_penalty_fails_the_premise_and_the_full_path_shows_it(fits, certify):
    out, calls = fits
    same_bits(out, "l2")
    notes = meta(out / "l2").get("notes", "")
    assert "micro-batch 0: the gradient of its backward is not the outputs' gradient" in notes
    assert "every micro-batch from micro-batch 0 on takes the full path" in notes
    # The full path's own forward on every step after micro-batch 0 (its
    # weight was taken from the float64 gradient the premise failed against).
    assert calls["l2-1"] - calls["l2-0"] == len(backward_residuals(out / "l2")) - 1, calls
    assert min(backward_residuals(out / "l2")) > EVIDENCE_WEIGHT_REL
    r = certify(out / "l2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "another loss than the declared summed loss" in r.stdout


# Dropout: no float64 clone (its float64 recompute would draw other
# masks), so the premise is checked against g_j in float32 at the state
# the step saw, drawing from torch's RNG as the step started (the step's
# own masks): it holds, the fit stays on the output path (no forward of
# the recorder's own but the two calibration samples' recomputes),
# uncalibrated, and PASSes.
def test_no_float64_clone_checks_the_premise_in_float32(fits, certify):
    out, calls = fits
    same_bits(out, "dropout")
    m = meta(out / "dropout")
    assert "notes" not in m, m
    assert m["calibration"].startswith("none:"), m
    assert calls["dropout-1"] - calls["dropout-0"] <= 2, calls
    r = certify(out / "dropout")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS (contract tier)" in r.stdout


# The same penalty with a summed loss that carries each item's share of it
# (train_keras.summed_with_penalty: the loss Keras differentiates): the
# premise holds, the fit stays on the output path (no forward of the
# recorder's own but the calibration's) and PASSes.
def test_penalty_in_the_summed_loss_passes_on_the_output_path(fits, certify):
    out, calls = fits
    same_bits(out, "l2_share")
    assert "notes" not in meta(out / "l2_share")
    assert calls["l2_share-1"] == calls["l2_share-0"], calls
    r = certify(out / "l2_share")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS (contract tier)" in r.stdout
