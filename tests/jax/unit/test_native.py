"""accumcheck_jax's native tap (native.py, native_tap.cc): on jax's CPU
backend the output path's tap and the optimizer update's values leave
your programs by an XLA FFI call, not a host callback.  What it hands
over is what the host callback handed over (the same trace, the same
trained bits), in program order; where it cannot be built the recorder
falls back to the host callback and says why in meta.csv."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_optax
from accumcheck_jax import native


def read(out):
    with open(out / "contract.csv") as f:
        rows = f.read()
    with open(out / "meta.csv") as f:
        meta = {r[0]: r[1] for r in csv.reader(f)}
    return rows, meta


def bits(params):
    return [np.asarray(x).view(np.uint32).copy() for x in jax.tree_util.tree_leaves(params)]


@pytest.mark.parametrize("loop", ["hand", "nnx"])
def test_native_tap_and_host_callback_record_the_same(tmp_path, monkeypatch, loop):
    """The hand loop (optax) and the Flax NNX loop through rec.apply,
    recorded once through the native tap and once through host callbacks
    (native.library made to say no): contract.csv the same to the last
    digit, the trained parameters the same bits, and meta.csv's recorder
    row says which tap ran."""
    if native.library(jax)[0] is None:
        pytest.skip("the native tap is not built here: %s" % native.library(jax)[1])
    a = train_optax.main(["--loop", loop, "--out", str(tmp_path / "native"), "--quiet"])
    monkeypatch.setattr(native, "library", lambda jax: (None, "made to say no here"))
    b = train_optax.main(["--loop", loop, "--out", str(tmp_path / "callback"), "--quiet"])
    rows_a, meta_a = read(tmp_path / "native")
    rows_b, meta_b = read(tmp_path / "callback")
    assert rows_a == rows_b
    assert "the tap an XLA FFI call (native_tap.cc)" in meta_a["recorder"]
    assert "the tap a host callback (made to say no here)" in meta_b["recorder"]
    assert all(np.array_equal(x, y) for x, y in zip(bits(a), bits(b)))


def test_queue_holds_each_call_in_order_and_mute_stops_it():
    """A channel's FFI call in a jitted program: each run's operands queued
    whole, oldest first, in their dtypes and shapes; the call's result a
    zero of the dtype asked; muted, the runs queue nothing and the zero is
    still written; closed, nothing is held."""
    lib, why = native.library(jax)
    if lib is None:
        pytest.skip("the native tap is not built here: %s" % why)
    ch = native.Channel(jax, lib)

    @jax.jit
    def f(x, y):
        return x.sum() + ch.zero(jnp.int32, [x, y]).astype(jnp.float32)
    xs = [jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * k for k in range(3)]
    y = jnp.asarray([1, 2], jnp.int16)
    for x in xs:
        assert float(f(x, y)) == float(x.sum())
    assert ch.held() == 3 * (6 * 4 + 2 * 2)
    got = ch.pull()
    assert len(got) == 3 and ch.held() == 0
    for (site, (gx, gy)), x in zip(got, xs):
        assert gx.dtype == np.float32 and gx.shape == (2, 3) and np.array_equal(gx, x)
        assert gy.dtype == np.int16 and np.array_equal(gy, [1, 2])
    ch.mute()
    assert float(f(xs[1], y)) == float(xs[1].sum())
    assert ch.pull() == [] and ch.held() == 0
    ch.close()
    assert ch.held() == 0


def test_build_failure_falls_back_and_says_why(tmp_path, monkeypatch):
    """No compiler that builds it ($CXX a command that fails) and nothing
    in the cache: the tap stays a host callback, meta.csv says why, and the
    loop is recorded all the same."""
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setenv("CXX", "false")
    monkeypatch.setenv("ACCUMCHECK_CACHE_DIR", str(tmp_path / "cache"))
    lib, why = native.library(jax)
    assert lib is None and "false could not build it" in why, why
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written
    train_optax.main(["--loop", "hand", "--out", str(tmp_path / "t"), "--quiet"])
    _, meta = read(tmp_path / "t")
    assert "the tap a host callback (the native tap could not be built or loaded (false " \
        "could not build it" in meta["recorder"], meta["recorder"]
    assert (tmp_path / "t" / "complete.csv").exists()
