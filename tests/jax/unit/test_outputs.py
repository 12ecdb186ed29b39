"""accumcheck_jax's output path (rec.apply, outputs.py): the weights read
at the forward's outputs are the loop's own (1 / b_j for the mean loss),
and where its premise fails (the loss reaches the
parameters by another path, or the wrapped forward runs twice) the
recorder says so in meta.csv and takes the full path."""

import csv
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import train_optax
from accumcheck_jax import ContractRecorder
from accumcheck_jax import inbox, native, outputs
from accumcheck_jax.outputs import _dots_on_host, _fit_dots
from accumcheck_trace import error_model


def rows(out, kind):
    with open(out / "contract.csv") as f:
        return [r for r in csv.DictReader(f) if r["kind"] == kind]


def meta(out):
    with open(out / "meta.csv") as f:
        return {r[0]: r[1] for r in csv.reader(f)}


def test_weights_read_at_the_outputs(tmp_path):
    """Every micro-batch's weight and residual read at the outputs: the mean
    loss over micro-batches of 2 and 6 has w_j = 1 / b_j exactly (to
    float32's rounding of u_j = s_j / b_j), and the calibration samples'
    premise holds within its bound."""
    out = tmp_path / "apply"
    train_optax.main(["--loop", "mean_over_k", "--quiet", "--sizes", "2,6", "--out", str(out)])
    samples = {int(r["index"]): int(r["samples"]) for r in rows(out, "micro")}
    back = rows(out, "backward")
    assert len(back) == len(samples) > 0 and set(samples.values()) == {2, 6}
    for r in back:
        b = samples[int(r["ref"])]
        assert abs(float(r["value"]) * b - 1.0) <= 1e-6, r
        assert float(r["residual"]) <= 1e-6
    cal = [float(r["scale"]) for r in rows(out, "micro") if r["scale"]]
    assert cal and max(cal) <= 1e-3
    assert "notes" not in meta(out)
    assert "rec.apply" in meta(out)["recorder"]


def logits(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def run(out, summed_of, grad_of, steps=6, K=2):
    """A hand loop recorded through rec.apply: summed_of(forward) is the
    summed loss, grad_of(forward) the gradient function's loss."""
    box = {"forward": logits}
    def fwd(p, x):  # read at each call
        return box["forward"](p, x)
    rec = ContractRecorder(summed_of(fwd), lambda b: len(b[1]), accumulation=K, out=str(out),
                           lr=1e-2)
    box["forward"] = rec.apply(logits)
    tx = rec.optimizer(optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2))
    grad_fn = rec.grad(jax.jit(jax.grad(grad_of(fwd))))
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(k1, (6, 8)), "w2": jax.random.normal(k2, (8, 3))}
    state = tx.init(params)
    rng = np.random.default_rng(0)
    for _ in rec.watch(range(1)):
        for _ in range(steps):
            acc = None
            for _ in range(K):
                batch = (jnp.asarray(rng.standard_normal((4, 6)), jnp.float32),
                         jnp.asarray(rng.integers(0, 3, 4), jnp.int32))
                g = grad_fn(params, batch)
                acc = g if acc is None else jax.tree_util.tree_map(jnp.add, acc, g)
            acc = jax.tree_util.tree_map(lambda a: a / (4 * K), acc)
            updates, state = tx.update(acc, state, params)
            params = optax.apply_updates(params, updates)
    rec.close(params)
    return params


def ce(forward, penalty=0.0, twice=False):
    def summed(params, batch):
        x, y = batch
        logp = jax.nn.log_softmax(forward(params, x))
        if twice:
            logp = 0.5 * (logp + jax.nn.log_softmax(forward(params, x)))
        loss = -jnp.sum(jnp.take_along_axis(logp, y[:, None], axis=1))
        return loss + penalty * jnp.sum(params["w1"] ** 2)
    return summed


def test_penalty_premise_fails_full_path_taken(tmp_path):
    """Your loss the batch mean plus a weight penalty, the summed loss the
    sum plus the same penalty: at the outputs u_j = s_j / 4 exactly, but
    c_j is no multiple of g_j.  The first calibration sample sees it: the
    note, and every backward pass fitted against g_j (residuals far from
    the output path's zero)."""
    def mine(f):
        return lambda p, b: ce(f)(p, b) / 4 + 0.5 * jnp.sum(p["w1"] ** 2)
    run(tmp_path / "t", lambda f: ce(f, penalty=0.5), mine)
    notes = meta(tmp_path / "t").get("notes", "")
    assert "micro-batch 0: the gradient of its backward is not the outputs' gradient" in notes
    assert "takes the full path" in notes
    assert min(float(r["residual"]) for r in rows(tmp_path / "t", "backward")) > 1e-3


def test_forward_twice_full_path_taken(tmp_path, certify):
    """The wrapped forward run twice per micro-batch: no one output to read
    the weight at; the note, the full path, and the correct loop PASSes."""
    run(tmp_path / "t", lambda f: ce(f, twice=True), lambda f: ce(f, twice=True))
    notes = meta(tmp_path / "t").get("notes", "")
    assert "the wrapped forward's backward ran 2 times in 1 micro-batches" in notes, notes
    r = certify(tmp_path / "t")
    assert "PASS (contract tier)" in r.stdout, r.stdout + r.stderr


def test_apply_refuses_what_is_no_function(tmp_path):
    rec = ContractRecorder(ce(logits), lambda b: len(b[1]), accumulation=1,
                           out=str(tmp_path / "t"))
    with pytest.raises(Exception) as e:
        rec.apply("logits")
    assert "expected your model's forward function" in str(e.value)


def test_premise_allows_float32_own_error(tmp_path):
    """A calibration sample where float32 itself strays from float64 by more
    than the fixed bound (a model near its minimum): c_j / w_j as far from
    g64 as the full path's own float32 gradient is, within
    contract_fit_calibration times that, keeps the output path (no note);
    the same distance with a float32 gradient equal to g64 (float32 exact
    there) is the loss reaching the parameters by another path.  Within
    the fixed bound of the float32 gradient, float64 is never asked: that
    distance is the calibration."""
    rec = ContractRecorder(ce(logits), lambda b: len(b[1]), accumulation=1,
                           out=str(tmp_path / "t"))
    rng = np.random.default_rng(0)
    g64 = rng.standard_normal(64)
    c = 0.25 * (g64 + 0.05 * np.linalg.norm(g64) * rng.standard_normal(64) / 8.0)
    lin = np.linalg.norm(c / 0.25 - g64) / np.linalg.norm(g64)
    assert 1e-3 < lin < 0.1
    asked = []

    def g64_of(full, batch):
        asked.append(1)
        return g64
    rec._g64 = g64_of
    rec._g32 = lambda full, batch: g64 + (c / 0.25 - g64)[::-1]  # as far, elsewhere
    cal, ref = rec._premise(0, c, (0.25, 0.0), None, None)
    assert cal == pytest.approx(lin) and ref is g64 and asked
    assert not rec.notes
    rec._g32 = lambda full, batch: g64
    cal, ref = rec._premise(0, c, (0.25, 0.0), None, None)
    assert cal is None and ref is g64
    assert "the loss reaches the parameters by another path" in rec.notes[0]
    # c_j / w_j within the fixed bound of the float32 gradient: no float64.
    asked.clear()
    g32 = c / 0.25 * (1 + 1e-5)
    rec._g32 = lambda full, batch: g32
    cal, ref = rec._premise(1, c, (0.25, 0.0), None, None)
    assert ref is g32 and not asked
    assert cal == pytest.approx(np.linalg.norm(c / 0.25 - g32) / np.linalg.norm(g32))
    # The factor is the error model's row, through the one mirror.
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
    with open(os.path.join(root, "oracle", "error_model.hpp")) as f:
        row = re.search(r'\{\s*"contract_fit_calibration",\s*([0-9.eE+-]+)\s*,', f.read())
    assert outputs.CONTRACT_FIT_CALIBRATION is error_model.CONTRACT_FIT_CALIBRATION
    assert float(row.group(1)) == error_model.CONTRACT_FIT_CALIBRATION


@pytest.mark.parametrize("host_dots", [False, True])
def test_dots_on_the_device_match_the_host(tmp_path, host_dots):
    """The device program's weight and residual of u = w s (s_j through
    the summed loss at the tapped outputs, the dots in float64) are the
    host's float64 least squares on the same s and u; so are the CPU
    backend's (host_dots: the program s_j alone, the dots the host's,
    _dots_on_host)."""
    box = {"forward": logits}
    rec = ContractRecorder(ce(lambda p, x: box["forward"](p, x)), lambda b: len(b[1]),
                           accumulation=1, out=str(tmp_path / "t"))
    rec._host_dots = host_dots
    box["forward"] = rec.apply(logits)
    params = {"w1": jnp.zeros((6, 8)), "w2": jnp.zeros((8, 3))}
    rec.shapes, rec.p_dtypes = [(6, 8), (8, 3)], [jnp.float32, jnp.float32]
    rec.state_shapes = list(zip(rec.shapes, rec.p_dtypes))
    rec.treedef = jax.tree_util.tree_structure(params)
    rng = np.random.default_rng(1)
    o = rng.standard_normal((4, 3)).astype(np.float32)
    batch = (rng.standard_normal((4, 6)).astype(np.float32), np.array([0, 2, 1, 2], np.int32))
    rec.out_treedef = jax.tree_util.tree_structure(o)
    s = np.asarray(jax.grad(lambda z: -jnp.sum(jnp.take_along_axis(
        jax.nn.log_softmax(z), batch[1][:, None], axis=1)))(o), np.float64)
    u = (2.0 * s + 1e-3 * rng.standard_normal(s.shape)).astype(np.float32)
    got = jax.device_get(rec._dots_of(([o], [u]), batch))
    w, resid = _fit_dots(_dots_on_host([u], got) if host_dots else np.asarray(got))
    u64 = u.astype(np.float64).ravel()
    s64 = s.ravel()
    w_host = float(u64 @ s64 / (s64 @ s64))
    r_host = np.linalg.norm(u64 - w_host * s64) / (abs(w_host) * np.linalg.norm(s64))
    assert w == pytest.approx(w_host, rel=1e-6) and abs(w - 2.0) < 1e-2
    assert resid == pytest.approx(r_host, rel=1e-4) and resid > 1e-5


def sized_loop(forward, logits_of, out=None, hidden=8, classes=3, seed=1, steps=4,
               mean_of_means=False, sizes=None):
    """A hand loop over micro-batches of 3 and 5 samples (K = 2; sizes: each
    step's pair instead), its loss
    the summed cross-entropy of logits_of(f, params, x), f the forward
    (wrapped by rec.apply when recorded to out, else None); each window's
    gradient divided by its samples (or, mean_of_means, each micro-batch's
    by its own and the window's by K).  The trained parameters."""
    box = {"f": forward}

    def summed(p, b):
        logp = jax.nn.log_softmax(logits_of(box["f"], p, b[0]).astype(jnp.float32))
        return -jnp.sum(jnp.take_along_axis(logp, b[1][:, None], axis=1))
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2)
    grad_fn = jax.jit(jax.grad(summed))
    rec = None
    if out is not None:
        rec = ContractRecorder(summed, lambda b: len(b[1]), accumulation=2, out=str(out), lr=1e-2)
        box["f"] = rec.apply(forward)
        tx = rec.optimizer(tx)
        grad_fn = rec.grad(grad_fn)
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"w1": jax.random.normal(k1, (6, hidden)), "w2": jax.random.normal(k2, (hidden, classes))}
    state = tx.init(params)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        acc, n = None, 0
        for b in (sizes[step] if sizes else (3, 5)):
            batch = (jnp.asarray(rng.standard_normal((b, 6)), jnp.float32),
                     jnp.asarray(rng.integers(0, classes, b), jnp.int32))
            g = grad_fn(params, batch)
            if mean_of_means:
                g = jax.tree_util.tree_map(lambda a, b=b: a / b, g)
            acc = g if acc is None else jax.tree_util.tree_map(jnp.add, acc, g)
            n += b
        acc = jax.tree_util.tree_map(lambda a: a / (2 if mean_of_means else n), acc)
        updates, state = tx.update(acc, state, params)
        params = optax.apply_updates(params, updates)
    if rec is not None:
        rec.close(params)
    return params


def one_example(p, x):
    return jnp.tanh(x @ p["w1"]) @ p["w2"]


def vmapped_loop(out=None):
    """sized_loop with a one-example forward mapped over the batch (jax.vmap)."""
    return sized_loop(one_example, lambda f, p, x: jax.vmap(f, (None, 0))(p, x), out)


def bf16_forward(p, x):
    h = jnp.tanh(x.astype(jnp.bfloat16) @ p["w1"].astype(jnp.bfloat16))
    return h @ p["w2"].astype(jnp.bfloat16)


def bf16_loop(out=None, mean_of_means=False):
    """sized_loop with a forward computing in bfloat16 from float32
    parameters (its outputs bfloat16, as a mixed-precision model's)."""
    return sized_loop(bf16_forward, lambda f, p, x: f(p, x), out, hidden=16, classes=4, seed=2,
                      steps=5, mean_of_means=mean_of_means)


def test_forward_under_vmap_full_path_taken(tmp_path, certify):
    """Your loss maps the wrapped forward over the batch's examples
    (jax.vmap): the tap sees one example's outputs, not the micro-batch's,
    so it taps nothing there (before, its host callback had no batching
    rule and your program failed to trace); the note, the full path, the
    correct loop PASSes, and the trained parameters are the plain run's
    bits."""
    plain = vmapped_loop()
    recorded = vmapped_loop(tmp_path / "t")
    notes = meta(tmp_path / "t").get("notes", "")
    assert "the forward rec.apply wrapped runs under jax.vmap" in notes, notes
    r = certify(tmp_path / "t")
    assert "PASS (contract tier)" in r.stdout, r.stdout + r.stderr
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(recorded)):
        assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def test_bfloat16_forward_judged_in_its_precision(tmp_path, certify):
    """A forward computing its outputs in bfloat16 (float32 parameters):
    the weights read at those outputs carry bfloat16's rounding, so the
    trace's precision is bfloat16 (with float32 the correct loop FAILed
    its weight fit at 1.11 of the bound); the correct loop PASSes,
    bit-identical to the plain run, and the mean of micro-batch means
    FAILs named."""
    plain = bf16_loop()
    recorded = bf16_loop(tmp_path / "t")
    assert meta(tmp_path / "t")["precision"] == "bfloat16"
    r = certify(tmp_path / "t")
    assert "PASS (contract tier)" in r.stdout, r.stdout + r.stderr
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(recorded)):
        assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    bf16_loop(tmp_path / "m", mean_of_means=True)
    r = certify(tmp_path / "m")
    assert "FAIL (contract tier)" in r.stdout and "diagnosis: matches sample-mean-of-means" \
        in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("tap", ["native", "callback"])
def test_heap_handed_back_only_after_a_compilation(tmp_path, monkeypatch, tap):
    """The recorder hands glibc's free heap back (accumcheck_trace.heap)
    before a micro-batch only when jax compiled a program since the last
    one (inbox._Compiles): at the first micro-batch, while the loop's
    programs first compile, and after a micro-batch of a new size
    recompiled your gradient; never in the windows between, where each
    trim would only make your forward fault its memory in again.  The
    optimizer update, called outside jit here, compiles once, through
    either tap (its call was compiled anew every step)."""
    if tap == "callback":
        monkeypatch.setattr(native, "library", lambda jax: (None, "made to say no here"))
    at = []

    def counted():
        at.append(sys._getframe(1).f_locals["self"].n_backward)
    monkeypatch.setattr(inbox, "heap_trim", counted)
    sizes = [(3, 5)] * 5 + [(4, 5)]
    sized_loop(lambda p, x: jnp.tanh(x @ p["w1"]) @ p["w2"], lambda f, p, x: f(p, x),
               tmp_path / "trace", steps=6, sizes=sizes)
    assert at[0] == 0
    assert not [j for j in at if 4 <= j <= 9], at  # windows 3 to 5 and the 6th's first
    # The 4's own call follows its batch's first conversion to that shape
    # (where no earlier test made one), the next follows its gradient's.
    assert 11 in at, at


def test_compiles_listener_sees_compilations_until_closed():
    """inbox._Compiles: true at first, false once taken, true again after
    jax compiles a program, and deaf once closed."""
    c = inbox._Compiles(jax)
    assert c.take() and not c.take()
    jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(7)).block_until_ready()
    assert c.take() and not c.take()
    c.close()
    jax.jit(lambda x: x * 5.0 - 2.0)(jnp.ones(7)).block_until_ready()
    assert not c.take()


def test_heap_trim_only_with_enough_free_heap(monkeypatch):
    """accumcheck_trace.heap.heap_trim calls glibc's malloc_trim(0) only
    when mallinfo2 says at least HEAP_TRIM_FREE_BYTES are free."""
    from types import SimpleNamespace

    from accumcheck_trace import heap
    calls, free = [], [heap.HEAP_TRIM_FREE_BYTES - 1]
    monkeypatch.setattr(heap, "_TRIM", [(calls.append, lambda: SimpleNamespace(fordblks=free[0]))])
    heap.heap_trim()
    assert calls == []
    free[0] = heap.HEAP_TRIM_FREE_BYTES
    heap.heap_trim()
    assert calls == [0]
