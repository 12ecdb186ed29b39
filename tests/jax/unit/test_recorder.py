"""accumcheck_jax's ContractRecorder: recording never changes the run
(the trained parameters bit-identical with and without it, through
rec.apply's output path, train_optax.py's default, and without it,
--no-apply), and bad input is refused with what to pass."""

import csv
import functools

import jax
import numpy as np
import optax
import pytest
import train_optax
from accumcheck_jax import ContractRecorder, Refused


def leaves(params):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


@functools.lru_cache(maxsize=None)
def plain_run(loop, *args):
    """The loop's trained parameters without the recorder, run once for
    every recorded variant of it (--wrap-inside and --no-apply change the
    recording, not the loop): hand's three and nnx's two."""
    return leaves(train_optax.main(["--loop", loop, "--no-record", "--quiet", *args]))


# The hand loop through rec.apply, the mean loss, MultiSteps over 48
# samples (equal and unequal micro-batches) and token items are compared
# where CTest records them (JAX.contract.optax.hand, .mean_over_k,
# .multisteps, .multisteps.unequal, .tokens: train_optax.py --identity,
# the plain run first in the trainer's process), not recorded again here;
# the hand loop's trace PASSes there, and its output path (rec.apply in
# meta.csv, no note) is test_outputs.py's test_weights_read_at_the_outputs.
@pytest.mark.parametrize("loop,extra", [("nnx", []),
                                        ("hand", ["--no-apply"]),
                                        ("hand", ["--wrap-inside"]),
                                        ("multisteps", ["--wrap-inside"]),
                                        ("nnx", ["--wrap-inside"])])
def test_recording_changes_nothing(tmp_path, request, loop, extra):
    a = plain_run(loop, *[x for x in extra if x not in ("--wrap-inside", "--no-apply")])
    recorded = train_optax.main(["--loop", loop, "--out", str(tmp_path / "t"), "--quiet"] + extra)
    b = leaves(recorded)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), loop
    assert (tmp_path / "t" / "complete.csv").exists()
    if loop == "hand" and extra == ["--wrap-inside"]:
        # The correct loop's trace PASSes, recorded by a wrapper jitted
        # with your function (a callback): judged here, not recorded again
        # by a test of its own (the wrapper around it: JAX.contract.optax.hand).
        certified(request.getfixturevalue("certify"), tmp_path / "t")
    if not extra and loop == "nnx":
        # Through rec.apply, a Flax NNX model's call: g_j read at the
        # outputs throughout, no micro-batch sent to the full path.
        with open(tmp_path / "t" / "meta.csv") as f:
            meta = {r[0]: r[1] for r in csv.reader(f)}
        assert "rec.apply" in meta["recorder"] and "notes" not in meta, meta.get("notes")


def certified(certify, folder):
    r = certify(folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS (contract tier)" in r.stdout


def loss(p, b):
    return (p["w"] * b).sum()


def items(b):
    return len(b)


@pytest.mark.parametrize("kwargs,said", [
    ({}, "pass summed_loss"),
    ({"summed_loss": loss, "count_fn": items, "accumulation": 0}, "accumulation must be an integer >= 1"),
    ({"summed_loss": loss, "count_fn": items, "accumulation": 2.0}, "accumulation must be an integer"),
    ({"summed_loss": loss, "count_fn": items, "accumulation": 2, "items": "rows"},
     "items must be 'samples' or 'tokens'"),
    ({"summed_loss": loss, "count_fn": items, "accumulation": 2, "schedule": {"kind": "warp"}},
     "schedule: expected None or {'kind'"),
    ({"summed_loss": loss, "count_fn": items, "accumulation": 2, "coordinates": 0},
     "coordinates must be an integer >= 1"),
    ({"summed_loss": "loss", "count_fn": items, "accumulation": 2}, "must be functions"),
    ({"summed_loss": loss, "count_fn": items, "accumulation": 2, "clip": 1.0},
     "clip=1.0: clipping is not recorded for optax yet"),
])
def test_bad_arguments_refused(tmp_path, kwargs, said):
    with pytest.raises(Refused) as e:
        ContractRecorder(out=str(tmp_path / "t"), **kwargs)
    assert said in str(e.value)


def test_optimizer_without_readable_lr_refused(tmp_path):
    rec = ContractRecorder(loss, items, accumulation=1, out=str(tmp_path / "t"))
    params = {"w": jax.numpy.ones(3)}
    g = rec.grad(jax.grad(loss))(params, jax.numpy.ones(3))
    tx = rec.optimizer(optax.sgd(0.1))
    with pytest.raises(Refused) as e:
        tx.update(g, tx.init(params), params)
    assert "optax.inject_hyperparams" in str(e.value)
    with pytest.raises(Refused) as e:
        rec.optimizer(object())
    assert "expected an optax GradientTransformation" in str(e.value)


def test_close_without_params_refused_and_marker_left(tmp_path):
    out = tmp_path / "t"
    rec = ContractRecorder(loss, items, accumulation=1, out=str(out), lr=0.1)
    params = {"w": jax.numpy.ones(3)}
    tx = rec.optimizer(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
    g = rec.grad(jax.grad(loss))(params, jax.numpy.ones(3))
    tx.update(g, tx.init(params), params)
    with pytest.raises(Refused) as e:
        rec.close()
    assert "rec.close(params)" in str(e.value)
    assert not (out / "complete.csv").exists()
    assert (out / "rank0.incomplete").exists()


# One recorded run for both (each a trace that must PASS): --warmup 2
# (lr 0 at the first step, so its update is zero and moves no parameter:
# still a step, its Adam state going on, never a discarded call) and
# coordinates=20 (a leaf larger than that kept on a seeded sample: the
# trace says how many coordinates).
def test_warmup_and_sampled_coordinates(tmp_path, certify):
    out = tmp_path / "t"
    train_optax.ContractRecorder = lambda *a, **k: ContractRecorder(*a, coordinates=20, **k)
    try:
        train_optax.main(["--loop", "hand", "--out", str(out), "--quiet", "--warmup", "2"])
    finally:
        train_optax.ContractRecorder = ContractRecorder
    meta = dict(line.split(",", 1) for line in (out / "meta.csv").read_text().splitlines()[1:])
    # w1 8x16 and w2 16x4 sampled to 20 each; b1 (16) and b2 (4) whole.
    assert meta["parameters"] == str(20 + 16 + 20 + 4)
    certified(certify, out)


def test_waits_once_per_parameter_set(tmp_path, monkeypatch):
    """The recorder waits for the program that made the parameters (so
    that the optimizer's callback is taken in before the micro-batch) only
    when they are new arrays: the hand loop's 22 micro-batches (44 samples
    in micro-batches of 4, K = 4, 2 epochs: 6 steps) see 6 parameter sets
    (the first, and those of the 5 steps a micro-batch follows)."""
    from accumcheck_jax import inbox
    waited, calls = [], []
    same = inbox.Inbox._same_arrays

    def counted(self, leaves):
        calls.append(1)
        seen = same(self, leaves)
        if not seen:
            waited.append(1)
        return seen
    monkeypatch.setattr(inbox.Inbox, "_same_arrays", counted)
    train_optax.main(["--loop", "hand", "--out", str(tmp_path / "t"), "--quiet"])
    assert (len(calls), len(waited)) == (22, 6)


def test_calibration_gradient_is_float64(tmp_path):
    """The calibration's g_j (calibrate.py _g64: the state and the batch
    widened inside its program, only the kept coordinates returned) is
    jax's float64 gradient of summed_loss at the float64 state, at the
    kept coordinates: not the float32 one."""
    rec = ContractRecorder(train_optax.summed_loss, items, accumulation=1,
                           out=str(tmp_path / "t"), coordinates=20)
    params = train_optax.init_params(8, 16, 4)
    x, y = train_optax.data(4, 8, 4)
    batch = (x, y)
    rec.grad(jax.jit(jax.grad(train_optax.summed_loss)))(params, batch)
    full = leaves(params)
    got = rec._g64(full, batch)
    with jax.enable_x64(True):
        wide = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
        g64 = jax.grad(train_optax.summed_loss)(wide, (x.astype(np.float64), y))
        want = rec.layout.host(jax.tree_util.tree_leaves(g64))
    assert got.dtype == np.float64 and got.shape == want.shape == (rec.layout.d,)
    # Both float64 evaluations of the same sums (8 features, 16 hidden
    # units, 4 classes, 4 samples: 32 terms along the longest chain), each
    # within 32 u of exact (u = 2^-53, float64's unit roundoff: the
    # standard bound for a sum of n terms, n u), so within 2 * 32 u of
    # each other; a float32 gradient is some 1e-8 of the norm away.
    assert np.linalg.norm(got - want) <= 2 * 32 * 2.0 ** -53 * np.linalg.norm(want)
    rec._abandon("test")


@pytest.mark.parametrize("loop,extra", [("hand", ["--no-apply"]), ("nnx", [])])
def test_late_update_still_taken_in_program_order(tmp_path, monkeypatch, loop, extra):
    """What the optimizer's update told (capture._told, in the program that
    makes the next parameters) is taken in 50 ms late: the recorder still
    takes it in after the micro-batches before it and before the one after
    it, so every step is where the loop made it (44 samples in
    micro-batches of 4, K = 4, 2 epochs: windows of 4, 4 and 3
    micro-batches, 6 steps).  On the CPU backend the update tells by the
    native tap, taken at your next call once its program has run
    (_take_told); what keeps the order then is the inbox, which queues it
    behind the micro-batches not yet taken in (the full path's,
    --no-apply, whose vectors wait on the device).  Taken in out of
    order, the update is refused (no micro-batch before it, or two
    updates in a row) or resolved against the parameters it made, its
    step lost (test_native.py's loops fail so with _take_told left out
    of the call)."""
    import time

    from accumcheck_jax import inbox
    arriving = inbox.Inbox._arriving

    def late(self, handler):
        tell = arriving(self, handler)
        if handler != self._on_update:
            return tell

        def later(*a):
            time.sleep(0.05)
            tell(*a)
        return later
    monkeypatch.setattr(inbox.Inbox, "_arriving", late)
    out = tmp_path / "t"
    train_optax.main(["--loop", loop, "--out", str(out), "--quiet"] + extra)
    with open(out / "contract.csv") as f:
        rows = list(csv.DictReader(f))
    versions = [int(r["version"]) for r in rows if r["kind"] == "micro"]
    windows = [4, 4, 3] * 2
    assert versions == [t for t, n in enumerate(windows) for _ in range(n)]
    assert sum(r["kind"] == "step" for r in rows) == len(windows)


def test_least_squares_is_lstsq():
    """capture.lstsq (the step's fit of its consumed gradient, steps.py
    _resolve, without the BLAS on the long dimension) solves what
    np.linalg.lstsq(A.T, b, rcond=None) solves, its cutoff included: rows
    independent, one row a multiple of another, one nearly so (apart by
    1e-13 of its norm: a singular value under lstsq's cutoff for A.T, eps
    * d of the largest, above the m x m triangle's own eps * m: cut by
    both, as lstsq cuts it), and a zero row.  Both are backward-stable
    least squares (Householder QR, and LAPACK's SVD): each solution within
    cond * m * d * eps of the exact one in norm (Higham, Accuracy and
    Stability, 20.2, the residual zero here), so within twice that of each
    other, cond the ratio of the largest singular value to the smallest
    kept."""
    from accumcheck_jax.capture import lstsq
    rng = np.random.default_rng(0)
    m, d = 17, 12292
    eps = np.finfo(np.float64).eps
    base = rng.standard_normal((m, d)) * rng.uniform(0.01, 10, size=(m, 1))
    cases = {"independent": base.copy(), "multiple": base.copy(), "nearly": base.copy(),
             "zero": base.copy()}
    cases["multiple"][-1] = 0.5 * base[0]
    cases["nearly"][-1] = base[0] + 1e-13 * np.linalg.norm(base[0]) / np.sqrt(d) \
        * rng.standard_normal(d)
    cases["zero"][3] = 0.0
    for name, A in cases.items():
        b = A.T @ rng.uniform(0, 1, m)
        want = np.linalg.lstsq(A.T, b, rcond=None)[0]
        got = lstsq(A, b)
        s = np.linalg.svd(A, compute_uv=False)
        kept = s[s > eps * d * s[0]]
        bound = 2 * (kept[0] / kept[-1]) * m * d * eps * np.linalg.norm(want)
        assert np.linalg.norm(got - want) <= bound, (name, np.linalg.norm(got - want), bound)


def test_recorder_error_ends_the_recording_not_the_loop(tmp_path, certify, capfd):
    """A count_fn that fails while the loop runs (the recorder meets it in
    its wrapper, its optimizer callback or the epoch's sync): the recording
    ends saying so, the loop trains on, bit-identical to the plain run,
    and certify refuses the folder naming why (exit 2)."""
    def failing(summed_loss, count_fn, **k):
        return ContractRecorder(summed_loss, lambda batch: 1 / 0, **k)
    train_optax.ContractRecorder = failing
    try:
        recorded = train_optax.main(["--loop", "hand", "--out", str(tmp_path / "t"), "--quiet"])
    finally:
        train_optax.ContractRecorder = ContractRecorder
    for x, y in zip(plain_run("hand"), leaves(recorded)):
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
    marker = (tmp_path / "t" / "rank0.incomplete").read_text()
    assert "count_fn(batch) failed on micro-batch 0: division by zero" in marker, marker
    assert "accumcheck_jax: not recording" in capfd.readouterr().err
    assert not (tmp_path / "t" / "complete.csv").exists()
    r = certify(tmp_path / "t")
    assert r.returncode == 2 and "division by zero" in r.stderr, r.stdout + r.stderr
