"""accumcheck_jax's KerasRecorder: recording never changes the fit (the
trained weights bit-identical with and without it), an error of the
recorder ends the recording with its reason and never the fit, and bad
input is refused with what to pass."""

import math
import os
import subprocess

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
import train_keras  # noqa: E402
from accumcheck_jax import KerasRecorder, Refused  # noqa: E402


def same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


# AdamW: the decay inside the update; the trace of a correct fit PASSes.
# (CI keeps to one case: bench/keras_contract_bench.py asserts the same
# bit-identity for every case of examples/jax/train_keras.py, on the
# backend it runs; CTest's JAX.keras.* and the conformance matrix certify
# every case.)
def test_recording_changes_nothing(tmp_path, certify):
    plain = train_keras.main(["--case", "adamw", "--no-record", "--quiet"])
    recorded = train_keras.main(["--case", "adamw", "--out", str(tmp_path / "t"), "--quiet"])
    same_bits(plain, recorded)
    assert not (tmp_path / "t" / "rank0.incomplete").exists()
    r = certify(tmp_path / "t")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok   optimizer replay" in r.stdout
    # The 18 calls of the micro-steps that only accumulate moved nothing,
    # the weights nor AdamW's moments (its decay is the update's).
    assert "ok   calls without an update: 18 optimizer call(s)" in r.stdout
    assert "(the parameters and the optimizer's state unchanged" in r.stdout
    assert "PASS (contract tier)" in r.stdout


# The JAX backend reads its program's results back every READ_EVERY (32)
# train steps, at each epoch's start and at the end: the example's fit in
# batches of 1 (48 steps an epoch) crosses all three, and every step is
# taken in, in order (96 micro-batches, 72 calls that only accumulate).
def test_read_back_in_groups_keeps_every_step(tmp_path, certify):
    argv = ["--case", "fit", "--batch", "1", "--quiet"]
    plain = train_keras.main(argv + ["--no-record"])
    recorded = train_keras.main(argv + ["--out", str(tmp_path / "t")])
    same_bits(plain, recorded)
    r = certify(tmp_path / "t")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok   weight fit: 96 backward passes" in r.stdout
    assert "ok   calls without an update: 72 optimizer call(s)" in r.stdout
    assert "PASS (contract tier)" in r.stdout


# The queue is read back sooner where its vectors reach the optax side's
# _INBOX_BYTES (a large model's kept coordinates): a bound of 1 byte reads
# each step's at once; the default, the first step's at once (a
# calibration sample on the output path: its premise decides the path of
# the steps after it) and the other 3 steps' at the fit's end.
def test_read_back_bounded_by_bytes(tmp_path, monkeypatch):
    from accumcheck_jax import keras_fit

    def longest_queue(bound):
        monkeypatch.setattr(keras_fit, "_INBOX_BYTES", bound)
        out = tmp_path / str(bound)
        rec = KerasRecorder(model(gradient_accumulation_steps=2), train_keras.summed_loss,
                            out=str(out), quiet=True)
        sizes, read = [], rec._read_queue

        def spy():
            sizes.append(len(rec._queue))
            read()
        rec._read_queue = spy
        fit(rec.net, [rec])
        assert (out / "complete.csv").exists() and not (out / "rank0.incomplete").exists()
        return max(sizes)
    assert longest_queue(1) == 1
    assert longest_queue(16 << 20) == 3


class _Jax:
    """A jax that compiles nothing: jit(fn, compiler_options) whose first
    call fails as a jaxlib that does not know an option does."""

    def __init__(self, takes_options=True, unknown=()):
        self.takes_options, self.unknown, self.made = takes_options, unknown, []

    def default_backend(self):
        return "cpu"

    def jit(self, fn, **kw):
        if kw and not self.takes_options:
            raise TypeError("jit() got an unexpected keyword argument 'compiler_options'")
        options = kw.get("compiler_options", {})
        self.made.append(options)

        def call(*args):
            bad = [k for k in options if k in self.unknown]
            if bad:
                raise RuntimeError("INVALID_ARGUMENT: No such compile option: '%s'" % bad[0])
            return fn(*args), options
        return call


def test_lean_compilation_falls_back_where_jax_lacks_it():
    from accumcheck_jax.capture import RARE as LEAN
    from accumcheck_jax.capture import _jit_rare

    def _jit_lean(jax, fn):
        return _jit_rare(jax, fn)
    # A jaxlib that knows every option: the first set, chosen once.
    f = _jit_lean(_Jax(), lambda x: x + 1)
    assert f(1) == (2, LEAN[0]) and f(2) == (3, LEAN[0])
    # One without the loop-emitter option: level 0 alone; a genuine error
    # is not taken for an unknown option.
    f = _jit_lean(_Jax(unknown=("xla_cpu_use_fusion_emitters",)), lambda x: x + 1)
    assert f(1) == (2, LEAN[1])
    f = _jit_lean(_Jax(), lambda x: 1 / x)
    with pytest.raises(ZeroDivisionError):
        f(0)
    # jax 0.4.30 (keras 3.4.1's and 3.5.0's venvs): no compiler_options.
    f = _jit_lean(_Jax(takes_options=False), lambda x: x + 1)
    assert f(1) == (2, {})


def model(**opt):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    m.compile(optimizer=keras.optimizers.SGD(0.1, **opt),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def fit(m, callbacks, **kw):
    x, y = train_keras.data(16, 8, 4)
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=callbacks, **kw)
    return [keras.ops.convert_to_numpy(v.value) for v in m.trainable_variables]


def test_recorder_error_ends_the_recording_not_the_fit(tmp_path, certify):
    def count(batch):
        raise ValueError("no items here")
    plain = fit(model(gradient_accumulation_steps=2), [])
    rec = KerasRecorder(model(gradient_accumulation_steps=2), train_keras.summed_loss,
                        count=count, out=str(tmp_path / "t"), quiet=True)
    same_bits(plain, fit(rec.net, [rec]))
    marker = (tmp_path / "t" / "rank0.incomplete").read_text()
    assert "count_fn(batch) failed on micro-batch 0: no items here" in marker
    r = certify(tmp_path / "t")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no items here" in r.stderr


def test_steps_per_execution_is_refused_softly(tmp_path):
    m = model(gradient_accumulation_steps=2)
    m.compile(optimizer=m.optimizer, loss=m.loss, steps_per_execution=2)
    rec = KerasRecorder(m, train_keras.summed_loss, out=str(tmp_path / "t"), quiet=True)
    fit(m, [rec])
    assert "steps_per_execution=2" in (tmp_path / "t" / "rank0.incomplete").read_text()


@pytest.mark.parametrize("make,said", [
    (lambda: KerasRecorder(), "pass the compiled model and summed_loss"),
    (lambda: KerasRecorder(object(), train_keras.summed_loss), "must be a keras.Model"),
    (lambda: KerasRecorder(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
                           train_keras.summed_loss), "call model.compile"),
    (lambda: KerasRecorder(model(clipnorm=1.0), train_keras.summed_loss),
     "clipnorm: clipping is not recorded"),
    (lambda: KerasRecorder(model(), train_keras.summed_loss, count=3),
     "count must be a function of the batch"),
    (lambda: KerasRecorder(model(), train_keras.summed_loss, schedule={"kind": "warp"}),
     "schedule: expected None or"),
])
def test_bad_input_says_what_to_pass(tmp_path, monkeypatch, make, said):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Refused) as e:
        make()
    assert said in str(e.value)


def test_conformance_cells_leave_the_backend_to_each_cell():
    """bench/conformance/cells.py's parent process (which forks a keras
    row's cells, the torch_* ones on Keras's torch backend) reads Keras's
    version without importing it: Keras fixes its backend at its import."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    probe = ("import json, sys; sys.path.insert(0, %r); import cells; said = cells.warm('keras'); "
             "print(json.dumps([said, 'keras' in sys.modules]))" % os.path.join(root, "bench", "conformance"))
    env = dict(os.environ, KERAS_BACKEND="jax")
    out = subprocess.run([os.sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         check=True).stdout.strip().splitlines()[-1]
    import json
    said, imported = json.loads(out)
    assert said["ok"] and said["version"] == keras.__version__, said
    assert not imported


def regularized(rec_loss=None, out=None):
    """A Dense(16, kernel_regularizer=L2(0.01)) MLP fitted with Adam, K = 4
    (the example's data, batch 4, 2 epochs): Keras's loss is the batch
    mean plus the model's losses (the regularizer), whose gradient reaches
    the kernel directly, not through y_pred.  rec_loss: the summed loss to
    record with (None: not recorded)."""
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)),
                          keras.layers.Dense(16, activation="tanh",
                                             kernel_regularizer=keras.regularizers.L2(0.01)),
                          keras.layers.Dense(4)])
    m.compile(optimizer=keras.optimizers.Adam(1e-2, gradient_accumulation_steps=4),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = [] if rec_loss is None else [KerasRecorder(m, rec_loss(m), out=str(out), quiet=True)]
    x, y = train_keras.data(48, 8, 4)
    m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=cb)
    return [keras.ops.convert_to_numpy(v.value) for v in m.trainable_variables]


def meta(folder):
    import csv
    with open(folder / "meta.csv") as f:
        return {r[0]: r[1] for r in csv.reader(f) if len(r) >= 2}


def backward_residuals(folder):
    import csv
    with open(folder / "contract.csv") as f:
        return [float(r["residual"]) for r in csv.DictReader(f) if r["kind"] == "backward"]


# The summed loss without the regularizer: u_j = s_j / 4 at the outputs,
# but c_j carries the regularizer's gradient, no multiple of g_j.  The
# first calibration sample's premise (c_j / w_j against g_j in float64)
# sees it: the note, and every step from micro-batch 0 on fitted against
# g_j on the full path (residuals far from the output path's ~1e-7).
def test_regularizer_premise_fails_full_path_taken(tmp_path):
    plain = regularized()
    recorded = regularized(lambda m: train_keras.summed_loss, tmp_path / "t")
    same_bits(plain, recorded)
    assert not (tmp_path / "t" / "rank0.incomplete").exists()
    notes = meta(tmp_path / "t").get("notes", "")
    assert "micro-batch 0: the gradient of its backward is not the outputs' gradient" in notes, notes
    assert "takes the full path" in notes
    res = backward_residuals(tmp_path / "t")
    assert len(res) == 24 and min(res) > 1e-3, res


# The summed loss with each item's share of the regularizer (Keras's loss
# is the batch mean plus model.losses: per item CE_i + sum(model.losses)),
# read from the weights the step sees: c_j = g_j / 4 exactly, so the
# premise holds on the output path, and the correct fit PASSes.
def test_regularizer_in_the_summed_loss_passes(tmp_path, certify):
    plain = regularized()
    recorded = regularized(train_keras.summed_with_penalty, tmp_path / "t")
    same_bits(plain, recorded)
    assert "notes" not in meta(tmp_path / "t")
    r = certify(tmp_path / "t")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS (contract tier)" in r.stdout


# A callback that moves the weights between two train steps (Keras hands
# the step a state made anew from the variables it synced): the recorder
# reads that step's input by its own program, not from the previous step's
# outputs, so the replay sees the move and certify fails the fit.
def test_weights_moved_between_steps_are_seen(tmp_path, certify):
    class Nudge(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:   # inside a window (K = 2: calls 4 and 5)
                w = self.model.trainable_variables[0]
                w.assign(w * 1.01)
    m = model(gradient_accumulation_steps=2)
    rec = KerasRecorder(m, train_keras.summed_loss, out=str(tmp_path / "t"), quiet=True)
    x, y = train_keras.data(48, 8, 4)
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[rec, Nudge()])
    r = certify(tmp_path / "t")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL optimizer replay" in r.stdout, r.stdout


def example_fit(make, recorded, out, **kw):
    """The example's correct fit (48 samples, batch 4, K = 4, 2 epochs) of
    the model make() builds; returns its trained weights and History."""
    keras.utils.set_random_seed(0)
    m = make()
    m.compile(optimizer=keras.optimizers.Adam(1e-2, gradient_accumulation_steps=4),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = [KerasRecorder(m, train_keras.summed_loss, out=str(out), quiet=True)] if recorded else []
    x, y = train_keras.data(48, 8, 4)
    h = m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=cb, **kw)
    return [keras.ops.convert_to_numpy(v.value) for v in m.trainable_variables], h.history


def mlp():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(4)])


# A model with its own train_step: the recorder's taps cannot go into it,
# so every step takes the full path (a program of the recorder's own
# before each step, c_j too), with a note; the correct fit PASSes.
def test_own_train_step_takes_the_full_path(tmp_path, certify):
    class Own(keras.Sequential):
        def train_step(self, state, data):
            return super().train_step(state, data)

    def make():
        return Own(mlp().layers)
    plain, _ = example_fit(make, False, None)
    recorded, _ = example_fit(make, True, tmp_path / "t")
    same_bits(plain, recorded)
    assert "the model's train_step is its own, not Keras's" in meta(tmp_path / "t")["notes"]
    r = certify(tmp_path / "t")
    assert r.returncode == 0 and "PASS (contract tier)" in r.stdout, r.stdout + r.stderr


# Sample weights and validation data: the step's taps leave its logs
# before Keras sees them (the History holds the same keys), the
# validation's steps are not recorded, and the weighted fit PASSes on the
# output path (Keras's loss sum(w_i l_i) / n: weight 1/n at the outputs).
def test_sample_weight_and_validation_on_the_output_path(tmp_path, certify):
    x, y = train_keras.data(48, 8, 4)
    kw = dict(sample_weight=np.linspace(0.5, 1.5, 48).astype(np.float32),
              validation_data=(x[:8], y[:8]))
    plain, h0 = example_fit(mlp, False, None, **kw)
    recorded, h1 = example_fit(mlp, True, tmp_path / "t", **kw)
    same_bits(plain, recorded)
    assert sorted(h0) == sorted(h1)
    assert "notes" not in meta(tmp_path / "t")
    r = certify(tmp_path / "t")
    assert r.returncode == 0 and "PASS (contract tier)" in r.stdout, r.stdout + r.stderr
    assert "ok   weight fit: 24 backward passes" in r.stdout, r.stdout


# An error of the taps where Keras traces its train step ends the
# recording with its reason; the step runs as fit made it, the fit goes
# on and its weights are the same bits.
def test_tap_error_in_the_traced_step_ends_the_recording_not_the_fit(tmp_path, monkeypatch):
    from accumcheck_jax import keras_taps

    def broken(self, grads, trainable, opt_vars):
        raise RuntimeError("a tap that does not fit")
    monkeypatch.setattr(keras_taps.KerasTaps, "_step_vector", broken)
    plain, _ = example_fit(mlp, False, None)
    recorded, _ = example_fit(mlp, True, tmp_path / "t")
    same_bits(plain, recorded)
    assert "a tap that does not fit" in (tmp_path / "t" / "rank0.incomplete").read_text()


# A model that draws random numbers (the example's dropout case: Dropout
# and BatchNormalization) has no float64 clone, so its premise is checked
# against g_j in float32 at the same state and the same draws (the masks
# come from the seed state the step starts from): it holds, far inside
# the fixed bound, and the fit stays on the output path, uncalibrated.  A
# float32 reference 1% off on half its coordinates breaks the premise at
# micro-batch 0: the note, and the full path from there on.
def test_random_model_checks_its_premise_in_float32(tmp_path, monkeypatch, certify):
    from accumcheck_jax import keras_fit
    from accumcheck_jax.outputs import EVIDENCE_WEIGHT_REL, Outputs, _premise_distance
    checked = []
    premise = Outputs._premise

    def spy(self, j, c, fit, full, batch):
        cal, ref = premise(self, j, c, fit, full, batch)
        checked.append((j, cal, _premise_distance(c, fit, ref)))
        return cal, ref
    monkeypatch.setattr(Outputs, "_premise", spy)
    train_keras.main(["--case", "dropout", "--out", str(tmp_path / "t"), "--quiet"])
    assert [j for j, _, _ in checked] == [0, 16], checked
    # Held (not None), uncalibrated (NaN: no float64), far inside the bound.
    assert all(cal is not None and math.isnan(cal) and lin < EVIDENCE_WEIGHT_REL
               for _, cal, lin in checked), checked
    m = meta(tmp_path / "t")
    assert "full path" not in m.get("notes", "") and m["calibration"].startswith("none:"), m
    r = certify(tmp_path / "t")
    assert r.returncode == 0 and "PASS (contract tier)" in r.stdout, r.stdout + r.stderr

    g32 = keras_fit.KerasRecorder._g32

    def off(self, full, batch):
        g = g32(self, full, batch).copy()
        g[: len(g) // 2] *= 1.01
        return g
    monkeypatch.setattr(keras_fit.KerasRecorder, "_g32", off)
    train_keras.main(["--case", "dropout", "--out", str(tmp_path / "u"), "--quiet"])
    notes = meta(tmp_path / "u").get("notes", "")
    assert "micro-batch 0: the gradient of its backward is not the outputs' gradient" in notes, notes
    assert "takes the full path" in notes
