"""The contract tier's recorder for Keras 3 `model.fit` on its JAX backend
(and its torch backend: below), with the optimizer's own accumulation (`optimizer(...,
gradient_accumulation_steps=K)`).  It writes the same contract trace as
accumcheck_jax.ContractRecorder (whose fits, calibration bookkeeping and
writer it reuses), judged by `accumcheck certify --contract`.

    model.compile(optimizer=keras.optimizers.AdamW(1e-3, gradient_accumulation_steps=K),
                  loss=...)
    rec = KerasRecorder(model, summed_loss, out="trace/")
    model.fit(x, y, batch_size=B, epochs=E, callbacks=[rec])   # the trace is written at its end

    summed_loss(y_true, y_pred, sample_weight) -> the SUM of the batch's item
    losses (keras.ops; e.g. ops.sum(keras.losses.sparse_categorical_crossentropy(
    y_true, y_pred, from_logits=True))); count(batch) -> its loss-bearing
    items (default: its samples), batch = (x, y, sample_weight) as numpy.

How (a Keras callback; nothing of the run changes): when fit starts, the
callback wraps the model's train function (made by fit before any
callback runs) in a Python function that hands each train step its input
and takes what the step hands out.  On the JAX backend (keras_taps.py)
the step itself carries the recorder's taps, so Keras's own forward and
backward give, on d kept coordinates per variable (accumcheck_jax's
layout):
  - c_j, the gradient Keras's train step takes, and u_j, the cotangent
    its loss sends into the model's outputs y_pred; the recorder takes
    s_j, summed_loss's gradient at y_pred (a program the size of the
    outputs), and reads the weight w_j of c_j = w_j g_j at the outputs
    (u_j = w_j s_j: the output path, outputs.py), checked on every
    calibrate_every-th step against g_j in float64 (a model with no
    float64 clone, one that draws random numbers: against g_j in float32
    at the same state and draws, the fit uncalibrated); where that premise
    fails (the loss reaches the parameters by another path, as a
    regularizer summed_loss leaves out), every later step takes the full
    path: g_j, the gradient of
    summed_loss at the parameters the step sees, from a program of the
    recorder's own dispatched before the step (_make_probe);
  - the optimizer's accumulator going in (its gradient_accumulator
    variables), its own iteration counter and the lr its update uses (the
    optimizer's learning_rate read in a StatelessScope of its variables);
    the gradient the accumulation hands the update is then (c_j + acc) / K
    on the call the counter makes an update call ((counter + 1) % K == 0,
    Keras's rule), and nothing on the others;
  - the parameters: an update call is an optimizer step, its update the
    parameters' change across it (to the next call's, or the trained
    weights); the replay check adds that update to the parameters the
    window started from, so a Keras release that moves the parameters on
    calls that apply no update (its weight decay on every micro-step,
    before 3.5.0) fails it; and each call that applies no update writes
    an idle row: how many kept parameters and optimizer-state values (its
    per-weight lists: Adam's moments, SGD's momentum) moved across it.
What the steps hand out stays on the device, read back every READ_EVERY
steps or _INBOX_BYTES, at each epoch's start and at the end (the host
never waits on a step), and at once after a calibration sample on the
output path (its premise decides the path of the steps after it).  A
model whose train step is not Keras's own (or not jitted) gets one
program of the recorder's before each step computing all of it, c_j too
(jax.grad of the model's compute_loss_and_updates), with a note in
meta.csv.  The recorder's programs compile lean (capture._jit_rare,
its RARE options).
On the torch backend (a stateful train step) the same is read from the
live variables before the step, c_j is the .grad train_step's backward
leaves, read after it, and g_j is read at the model's outputs, from the
step's own backward (keras_torch.py: no forward of the recorder's own;
the full path, a forward and backward of its own, where that cannot be
checked or fails).
Every calibrate_every-th g_j again in float64 on a float64 clone of the
model (keras.models.clone_model, every layer's dtype float64), which
calibrates the fit; where the model cannot be cloned, or draws random
numbers (its float64 recompute would draw others), the fit is judged
without calibration (meta.csv's `calibration` row says so).
"""

import sys

import numpy as np
from accumcheck_trace.trace import VERSION, Refused, describe, real

from .capture import _jit_rare, dot, join, norm
from .contract import ContractRecorder, _enable_x64, _Leaves, _pack
from .inbox import _INBOX_BYTES
from .keras_taps import LOGS_KEY, KerasTaps, hookable
from .keras_torch import KerasTorch, _host, _torch_grad

# The JAX backend's train steps whose recorder program is read back
# together: one wait on the device per READ_EVERY steps, not per step,
# or sooner once the queued vectors hold the optax side's _INBOX_BYTES
# (a large model's kept coordinates; the queue also holds the batches).
READ_EVERY = 32


def idle_row(i, j, steps, p_before, p_after, state_changed=None):
    """contract.csv's idle row (docs/trace-format.md) of an optimizer call
    that applied no update: micro-batch j's call, `steps` optimizer steps
    before it, the kept parameters before and after it; state_changed: the
    sampled optimizer-state values it changed (None: not measured)."""
    d = np.asarray(p_after, dtype=np.float64) - np.asarray(p_before, dtype=np.float64)
    p = np.asarray(p_before, dtype=np.float64)
    moved = d != 0
    rel = moved & (p != 0)   # the largest |change| / |p| (over p != 0)
    worst = float(np.max(np.abs(d[rel]) / np.abs(p[rel]))) if rel.any() else 0.0
    lam = resid = ""
    pp = dot(p, p)
    if moved.any() and pp > 0:
        lam_v = -dot(d, p) / pp           # the change fitted as -lambda * p
        nd = norm(d)
        lam, resid = real(lam_v), real(norm(d + lam_v * p) / nd)
    state = "" if state_changed is None else "%d" % state_changed
    return "idle,%d,%d,,%d,%d,%s,%s,%s,%s\n" % (i, j, steps, int(moved.sum()), state, real(worst),
                                              lam, resid)


def _slot_lists(opt, trainable, ids, accumulators):
    """The optimizer's per-variable state (Adam's momentums and velocities,
    SGD's momentums, ...): each list of its variables, one per trainable
    variable of its shape, as indices into opt.variables.  Not the
    gradient accumulators (they move on every call) nor the weights'
    moving average (an EMA of its own)."""
    skip = {id(v) for v in accumulators or []}
    skip |= {id(v) for v in getattr(opt, "_model_variables_moving_average", None) or [] if v is not None}
    shapes = [tuple(v.shape) for v in trainable]
    out = []
    for name, value in sorted(vars(opt).items()):
        if not isinstance(value, (list, tuple)) or len(value) != len(shapes) or not value:
            continue
        if all(id(v) in ids and id(v) not in skip and tuple(v.shape) == shape
               for v, shape in zip(value, shapes)):
            out.append([ids[id(v)] for v in value])
    return out


def _keras():
    try:
        import keras
    except ImportError as e:  # pragma: no cover - the venv has it
        raise Refused("accumcheck_jax.KerasRecorder needs keras 3: bash scripts/venv-jax.sh "
                      "makes .venv-jax/ (%s)" % e)
    if keras.backend.backend() not in ("jax", "torch"):
        raise Refused("accumcheck_jax.KerasRecorder records Keras on its JAX or torch backend: "
                      "run with KERAS_BACKEND=jax or torch (this process runs %r)"
                      % keras.backend.backend())
    return keras


def _samples(batch):
    """The default count: the samples of the batch (its y's, else its x's)."""
    x, y, _ = batch
    import jax
    leaves = jax.tree_util.tree_leaves(y if y is not None else x)
    return int(np.shape(leaves[0])[0]) if leaves and np.ndim(leaves[0]) else 1


try:
    import keras as _keras_module
    _Callback = _keras_module.callbacks.Callback
except ImportError:  # pragma: no cover - the venv has it; _keras() says what to install
    _Callback = object


def _draws_random(model):
    """Whether a layer of the model draws random numbers (Dropout, noise):
    its float64 recompute would draw others (jax draws float64 uniforms
    under x64; torch's unseeded dropout draws from its global RNG)."""
    layers = [model] + list(getattr(model, "_flatten_layers", lambda: [])())
    return any(getattr(layer, "_seed_generators", None) for layer in layers)


class KerasRecorder(KerasTaps, KerasTorch, ContractRecorder, _Callback):
    """KerasRecorder(model, summed_loss, count=None, out="trace",
    items="samples", run="trainer", lr=None, schedule=None, accept=(),
    calibrate_every=16, coordinates=4096, seed=0, quiet=False): a
    keras.callbacks.Callback.

    model: compiled (model.compile(optimizer=..., loss=...)); K is its
    optimizer's gradient_accumulation_steps (None: 1).  summed_loss(y_true,
    y_pred, sample_weight): the SUM of the batch's item losses (it may read
    the model's weights, e.g. each item's share of a regularizer,
    n * sum(model.losses): the recorder calls it where they read as the
    values its gradient is taken at); count(batch):
    its loss-bearing items (default: its samples).  lr and schedule: the
    accepted schedule, as for ContractRecorder.  Pass it to fit:
    model.fit(..., callbacks=[rec]); the trace is written when fit ends."""

    # The output path's premise against float64 first (outputs._premise),
    # as before the optax recorder went float32 first: the torch backend's
    # probe of the float64 clone (keras_torch.py) and meta.csv's
    # `calibration` row for a model with no clone rest on it, and Keras's
    # recording cost at scale was not measured the other way.
    _premise_float32_first = False

    def __init__(self, model=None, summed_loss=None, count=None, out="trace", items="samples",
                 run="trainer", lr=None, schedule=None, accept=(), calibrate_every=16,
                 coordinates=4096, seed=0, quiet=False):
        keras = _keras()
        if model is None or summed_loss is None:
            raise Refused("accumcheck_jax.KerasRecorder: pass the compiled model and summed_loss "
                          "(the SUM of a batch's item losses: summed_loss(y_true, y_pred, "
                          "sample_weight))")
        if not isinstance(model, keras.Model):
            raise Refused("accumcheck_jax.KerasRecorder: model must be a keras.Model, got %s"
                          % type(model).__name__)
        opt = getattr(model, "optimizer", None)
        if opt is None or not hasattr(opt, "gradient_accumulation_steps"):
            raise Refused("accumcheck_jax.KerasRecorder: the model has no optimizer: call "
                          "model.compile(optimizer=..., loss=...) before making the recorder")
        for what in ("clipnorm", "clipvalue", "global_clipnorm"):
            if getattr(opt, what, None):
                raise Refused("accumcheck_jax.KerasRecorder: the optimizer's %s: clipping is not "
                              "recorded for Keras yet (the consumed gradient is read before "
                              "it); record without it" % what)
        if getattr(opt, "loss_scale_factor", None) is not None or \
                type(opt).__name__ == "LossScaleOptimizer":
            raise Refused("accumcheck_jax.KerasRecorder: a loss-scaled optimizer is not recorded "
                          "for Keras yet; record in float32 without loss scaling")
        if count is not None and not callable(count):
            raise Refused("accumcheck_jax.KerasRecorder: count must be a function of the batch "
                          "(x, y, sample_weight) -> its loss-bearing items, got %s"
                          % type(count).__name__)
        K = int(opt.gradient_accumulation_steps or 1)
        _Callback.__init__(self)
        ContractRecorder.__init__(self, summed_loss, count or _samples, accumulation=K, out=out,
                                  items=items, run=run, lr=lr, schedule=schedule, accept=accept,
                                  calibrate_every=calibrate_every, coordinates=coordinates,
                                  seed=seed, engine="keras", quiet=quiet)
        self.keras, self.net, self.opt = keras, model, opt
        self._orig = None          # the train function fit made
        self._clone64 = None       # the float64 clone (False: none could be made)
        self._why_uncalibrated = ""
        self._acc_index = None     # per trainable variable: its accumulator's index, or None
        self._iter_index = None    # the optimizer's iteration counter's index
        self._window_p = None      # the kept parameters the current window started from
        self._idle = 0             # the idle rows written (calls that applied no update)
        self._slots = []           # the optimizer's per-variable state: lists of indices
        self._state_now = None     # the kept coordinates of that state, at the last read
        self._queue = []           # steps whose program's result is not read back yet
        self._seen = 0             # train steps seen (queued or taken in)
        self._hook_why = ""        # why the train step carries no taps ("" where it does)
        self._probe_c = None       # the full path's program takes c_j too (no taps)
        self._gather = None        # the tapped step's program before it (keras_taps.py)
        self._handed = None        # the trainable and optimizer values the last step handed out
        self._post = None          # the last step's vector's state part, as read back
        self._stack = READ_EVERY   # s_j's program: the outputs of this many steps stacked
        self._taps_init()

    # ---- the callback

    def on_train_begin(self, logs=None):
        if self.closed:
            return
        model = self.net
        if getattr(model, "steps_per_execution", 1) != 1:
            self._refuse_softly("steps_per_execution=%d: the recorder reads each train step's "
                                "input; compile with steps_per_execution=1"
                                % model.steps_per_execution)
            return
        if getattr(model, "train_function", None) is None:
            self._refuse_softly("fit made no train function before its callbacks ran (this "
                                "Keras release's fit is not one the recorder knows)")
            return
        self._orig = model.train_function
        rec = self
        if self.keras.backend.backend() == "torch":
            self._torch_begin()

            def train_function(data):
                if rec.closed:
                    return rec._orig(data)
                try:
                    seen = rec._before_torch(data[0])
                except Exception as e:  # noqa: BLE001  (the run goes on; the recording ends)
                    rec._fail(e)
                    return rec._orig(data)
                try:
                    logs = rec._orig(data)
                finally:
                    rec._stepping = False
                try:
                    rec._after_torch(*seen)
                except Exception as e:  # noqa: BLE001
                    rec._fail(e)
                return logs
            model.train_function = train_function
            return

        why = hookable(model, self.keras)
        if why:
            self._hook_why = why
            self.notes.append("the recorder's taps cannot go into the train step (%s): every "
                              "step takes the full path (g_j and c_j recomputed)" % why)
        else:
            # The float64 clone made now, while fit has not yet taken the
            # variables' values into its state (the optimizer's config
            # reads its lr variable); without it the premise is checked
            # against g_j in float32 (outputs.Outputs._on_fast).
            with _enable_x64(self.jax):
                self._float64_clone()
            self._install_taps()
            self._orig = model.train_function

        def train_function(state, data):
            if rec.closed:
                return rec._orig(state, data)
            if hasattr(data, "__next__"):      # Keras >= 3.6: an iterator of batches
                batch = next(data)
                arg = iter([batch])
            else:                              # earlier: a list of batches
                batch, arg = data[0], data
            try:
                kind = rec._before_step(state, batch)
            except Exception as e:  # noqa: BLE001  (the run goes on; the recording ends)
                rec._fail(e)
                return rec._orig(state, arg)
            try:
                state_z = rec._with_z(state, batch) if kind != "untapped" else state
            except Exception as e:  # noqa: BLE001
                rec._fail(e)
                return rec._orig(state, arg)
            rec.in_step = kind != "untapped"
            try:
                logs, new_state = rec._orig(state_z, arg)
            except Exception as e:  # noqa: BLE001
                if kind == "untapped":
                    raise
                # The taps failed where Keras traces its step (a release
                # or model whose step they do not fit): the recording ends,
                # the step runs as fit made it (an error of the model's
                # own is raised there again).
                rec.in_step = False
                rec._fail(e)
                again = iter([batch]) if hasattr(data, "__next__") else data
                return rec.net.train_function(state, again)
            finally:
                rec.in_step = False
            rec._handed = (new_state[0], new_state[2])
            vec = logs.pop(LOGS_KEY, None) if isinstance(logs, dict) else None
            try:
                rec._after_step(kind, vec)
            except Exception as e:  # noqa: BLE001
                rec._fail(e)
            return logs, new_state
        model.train_function = train_function

    def on_epoch_begin(self, epoch, logs=None):
        if self.closed:
            return
        try:
            self._read_queue()   # the previous epoch's last steps
            self.epoch()         # (and the calibrations queued)
        except Exception as e:  # noqa: BLE001  (the run goes on; the recording ends)
            self._fail(e)

    def on_train_end(self, logs=None):
        if self._orig is not None and self.net.train_function is not self._orig:
            self.net.train_function = self._orig
        self._remove_taps()
        self._torch_end()
        if self.closed:
            return
        try:
            self._read_queue()
            if self.layout is not None:
                self._state_now = self._state_host()  # after the last call
            self.close([self.keras.ops.convert_to_numpy(v.value) for v in self.net.trainable_variables])
        except Refused:
            pass  # the marker says why; the run is not stopped by the recorder
        except Exception as e:  # noqa: BLE001
            self._fail(e)
        else:
            if not self.quiet:
                sys.stderr.write("accumcheck_jax: trace written to %s\n" % self.out)

    # ---- what each train step sees

    def _indices(self):
        opt = self.opt
        ids = {id(v): i for i, v in enumerate(opt.variables)}
        counter = getattr(opt, "_iterations", None)
        if counter is None or id(counter) not in ids:
            counter = opt.iterations
        if id(counter) not in ids:
            raise Refused("the optimizer's iteration counter is not among its variables (a "
                          "Keras release the recorder does not know)")
        self._iter_index = ids[id(counter)]
        accs = getattr(opt, "_accumulated_gradients", None) or []
        self._acc_index = []
        for v in self.net.trainable_variables:
            a = accs[opt._get_variable_index(v)] if self.K > 1 and accs else None
            self._acc_index.append(ids.get(id(a)) if a is not None else None)
        if self.K > 1 and any(i is None for i in self._acc_index):
            raise Refused("gradient_accumulation_steps=%d but the optimizer holds no "
                          "accumulator for some variable" % self.K)
        self._slots = _slot_lists(opt, self.net.trainable_variables, ids, accs)

    def _make_probe(self, with_c):
        """The full path's program, dispatched before the step on its
        input state and batch: g_j, the gradient of summed_loss at the
        parameters the step sees (its kept coordinates).  with_c (the
        step carries no taps): also c_j, the gradient Keras's train step
        takes (jax.grad of the model's compute_loss_and_updates, the
        function train_step differentiates), and the rest the taps would
        have taken: one vector g, c, p, acc, lr, update flag, state."""
        jax, keras, model = self.jax, self.keras, self.net
        jnp = jax.numpy
        unpack = keras.utils.unpack_x_y_sample_weight
        user = self._user_loss(model)
        rec = self

        def probe(trainable, non_trainable, opt_vars, metrics_vars, batch):
            x, y, sw = unpack(batch)

            def theirs(tv):
                return model.compute_loss_and_updates(
                    tv, non_trainable, metrics_vars, x, y, sw, training=True,
                    optimizer_variables=opt_vars)
            take = rec.layout.take
            g = jax.grad(user)(list(trainable), non_trainable, batch)
            if not with_c:
                return _pack(jnp, take(jnp, g))
            c, _ = jax.grad(theirs, has_aux=True)(list(trainable))
            # One vector (one transfer a step): g and c on the kept
            # coordinates, then what the taps would have handed out
            # (keras_taps._gathered: p, acc, lr, update flag, state).
            return _pack(jnp, take(jnp, g) + take(jnp, c)
                         + rec._gathered(list(trainable), opt_vars))
        return _jit_rare(jax, probe)

    def _before_step(self, state, batch):
        """Before the train step: its path ("fast": the taps give
        everything; "full": the taps give all but g_j, dispatched here;
        "untapped": this program gives it all), and, on a calibration
        sample, the whole state it starts from (the step consumes it).
        The full path's program result is queued (device arrays, read back
        with the others)."""
        trainable, non_trainable, opt_vars, metrics_vars = state
        if self.layout is None:
            shapes = [tuple(v.shape) for v in trainable]
            self.layout = _Leaves(shapes, self.coordinates, self.seed)
            self.shapes = shapes
            self.dtype = str(trainable[0].dtype)
            self._indices()
        kind = "untapped" if self._hook_why else ("full" if self.no_take else "fast")
        out = [None]
        # The state this step starts from: the one the previous tapped step
        # handed out (its vector holds it), unless another is passed in.
        chained = self._handed is not None and kind != "untapped" and \
            all(a is b for a, b in zip(trainable, self._handed[0])) and \
            all(a is b for a, b in zip(opt_vars, self._handed[1]))
        if kind != "untapped" and not chained:
            if self._gather is None:
                self._gather = self._gather_program()
            out[0] = self._gather(trainable, opt_vars)
        if kind != "fast":
            if self._probe is None or self._probe_c != (kind == "untapped"):
                self._probe_c = kind == "untapped"
                self._probe = self._make_probe(self._probe_c)
            out.append(self._probe(trainable, non_trainable, opt_vars, metrics_vars, batch))
        full = None
        if self._seen % self.calibrate_every == 0:
            full = ([np.asarray(v) for v in trainable], [np.asarray(v) for v in non_trainable])
        self._seen += 1
        self._queue.append([kind, out, None, full, batch])
        return kind

    def _after_step(self, kind, vec):
        """After the train step: the vector its taps handed out, queued;
        read back every READ_EVERY steps (or _INBOX_BYTES), at each epoch's
        start and at the end, so the host never waits on the device per
        step; a calibration sample on the output path at once (its premise
        decides the path of the steps after it)."""
        entry = self._queue[-1]
        if kind != "untapped":
            if vec is None:
                raise Refused("the train step handed out none of the recorder's taps (a Keras "
                              "release whose train step the recorder does not know)")
            entry[2] = vec
        size = sum(x.size * x.dtype.itemsize for x in self.jax.tree_util.tree_leaves(entry[1:3]))
        if len(self._queue) >= READ_EVERY or len(self._queue) * size >= _INBOX_BYTES or \
                (kind == "fast" and entry[3] is not None):
            self._read_queue()

    def _read_queue(self):
        """The queued steps' vectors read back at once, their weights read
        at the outputs (the output path), and taken in, in order."""
        queue, self._queue = self._queue, []
        if not queue:
            return
        got = self.jax.device_get([(e[1], e[2]) for e in queue])
        leaves = self.jax.tree_util.tree_leaves
        unpack = self.keras.utils.unpack_x_y_sample_weight
        hosts = [self.jax.tree_util.tree_map(np.asarray, tuple(unpack(e[4]))) for e in queue]
        fast = [i for i, e in enumerate(queue) if e[0] == "fast"]
        fits = {}
        if fast:
            # got[i][1]: the step's vector, u_j and y_pred (keras_taps.py).
            fits = dict(zip(fast, self._fits([
                ([np.asarray(a) for a in leaves(got[i][1][2])],
                 [np.asarray(a) for a in leaves(got[i][1][1])], hosts[i]) for i in fast])))
        d = self.layout.d
        for i, ((kind, _, _, full, _), (pre, c)) in enumerate(zip(queue, got)):
            if kind == "untapped":
                v = np.asarray(pre[1], dtype=np.float64)
                g, c, v = v[:d], v[d:2 * d], v[2 * d:]
                self._record(v[:d], g, c, v[d:2 * d], v[2 * d + 1] == 1, v[2 * d], full,
                             hosts[i], v[2 * d + 2:])
                continue
            # c_j the step's own; p, acc, lr, update flag and state those of
            # the state it started from: the gather program's, or the
            # previous step's vector's (the state it handed this one).
            c = np.asarray(c[0], dtype=np.float64)
            v = self._post if pre[0] is None else np.asarray(pre[0], dtype=np.float64)
            self._post = c[d:]
            g = None if kind == "fast" else np.asarray(pre[1], dtype=np.float64)
            self._record(v[:d], g, c[:d], v[d:2 * d], v[2 * d + 1] == 1, v[2 * d], full,
                         hosts[i], v[2 * d + 2:], fit=fits.get(i))

    def _record(self, p, g, c, acc, update, lr, full, host, st, fit=None):
        """One train step's call, both backends: the micro-batch's fit, and
        what the accumulation hands the update (update: whether the
        optimizer's counter makes it an update call); st: the kept
        coordinates of the optimizer's per-variable state before the
        call.  fit: the weight read at the model's outputs ((w, residual),
        "zero" or None: outputs.Outputs._on_fast, g unused), or None with
        g_j the recorder's own gradient (the full path)."""
        self._state_now = st
        if fit is not None:
            self._on_fast(p, c, full, host, fit)
        else:
            self._on_backward(p, g, c, full, host, packed=False)
        if len(self.since) == 1:
            self._window_p = p   # the parameters the window starts from
        # What the accumulation hands the update on this call: Keras's rule,
        # (c + acc) / K in the parameters' precision on the call its counter
        # makes an update call, nothing on the others.
        if update:
            c32 = np.asarray(c, dtype=np.float32)
            G = ((c32 + np.asarray(acc, dtype=np.float32)) / np.float32(self.K)) \
                if self.K > 1 else c32
        else:
            G = np.zeros(len(p), dtype=np.float32)
        if self.pending is not None:
            self._refuse("two optimizer updates with no micro-batch between them")
        self.pending = (np.asarray(G, dtype=np.float64), None, float(lr), self.p_last, update,
                        len(self.micro) - 1, st)

    def _state_host(self):
        """The kept coordinates of the optimizer's per-variable state, read
        from its live variables."""
        ov = self.opt.variables
        # torch: a view of the variable (keras's convert_to_numpy copies it whole)
        conv = _host if self.keras.backend.backend() == "torch" else self.keras.ops.convert_to_numpy
        return join([self.layout.host([conv(ov[i].value) for i in lst]) for lst in self._slots])

    def _resolve(self, p_now):
        """The pending call: a step when the parameters moved; its update is
        the parameters' change (Keras applies it inside the train step)."""
        if self.pending is None:
            return
        G, _, lr, p_before, update, j, st = self.pending
        if not update:
            # Accumulated: nothing applied, so nothing may move, the
            # parameters nor the optimizer's state (an idle row; the replay
            # from the window's start sees a parameter's move too).
            self.pending = None
            moved = int(np.sum(self._state_now != st)) if self._slots else None
            self.rows.append(idle_row(self._idle, j, self.steps, p_before, p_now, moved))
            self._idle += 1
            return
        u = (p_now.astype(np.float32) - p_before.astype(np.float32)).astype(np.float64)
        # Replayed from the window's start: the parameters after the
        # previous step + this call's change = those after it, unless
        # something else moved them during the window.
        self.pending = (G, u, lr, self._window_p, True)
        super()._resolve(p_now)

    def _calibrate(self):
        """g_j in float64, on the float64 clone, for the calibration samples
        queued by the full path (g_j the recorder's own gradient)."""
        queued, self.calibrate = self.calibrate, []
        for j, full, batch, g32 in queued:
            g64 = self._g64(full, batch)
            if g64 is None:
                return
            n64 = norm(g64)
            self.micro[j][4] = norm(g32 - g64) / n64 if n64 > 0 else 0.0

    def _user_loss(self, clone):
        """summed_loss through the model (or its float64 clone) called
        statelessly: fn(trainable, non_trainable, batch) -> the summed loss,
        batch = (x, y, sample_weight)."""
        unpack = self.keras.utils.unpack_x_y_sample_weight
        summed = self.summed_loss
        kw = {"training": True} if getattr(self.net, "_call_has_training_arg", True) else {}

        def user(tv, ntv, batch):
            x, y, sw = unpack(batch)
            y_pred, _ = clone.stateless_call(tv, ntv, x, **kw)
            return self._summed(summed, tv, ntv, y, y_pred, sw)
        return user

    def _summed(self, summed, tv, ntv, y, y_pred, sw):
        """summed(y, y_pred, sw) where the model's variables read as tv and
        ntv (Keras's StatelessScope, which casts them to the variables'
        dtypes): a summed loss that reads the weights (a regularizer's
        share: model.losses) sees the values its gradient is taken at, not
        the live variables (which fit holds in its own state)."""
        net = self.net
        mapping = list(zip(net.trainable_variables, tv)) + \
            list(zip(net.non_trainable_variables, ntv))
        with self.keras.StatelessScope(state_mapping=mapping):
            return summed(y, y_pred, sw)

    def _float64_clone(self):
        """The model cloned with every layer in float64 (made once), or
        False where it cannot be: the reason is kept for meta.csv."""
        if self._clone64 is None and _draws_random(self.net):
            self._clone64 = False
            self._why_uncalibrated = ("the model draws random numbers (Dropout, noise), which its "
                                      "float64 recompute would draw otherwise")
        if self._clone64 is None:
            try:
                def f64(layer):
                    config = dict(layer.get_config(), dtype="float64")
                    return layer.__class__.from_config(config)
                self._clone64 = self.keras.models.clone_model(self.net, clone_function=f64)
            except Exception as e:  # noqa: BLE001
                self._clone64 = False
                self._why_uncalibrated = "keras.models.clone_model failed: %s" % describe(e)
        return self._clone64

    def _g64(self, full, batch):
        """g_j in float64 (its kept coordinates) on the float64 clone, from
        the whole state the step saw (full: the trainable and non-trainable
        values, numpy) and its batch (x, y, sample_weight, numpy); None where
        the model has no float64 clone (meta.csv's `calibration` row says
        why)."""
        jax = self.jax
        with _enable_x64(jax):
            if self._clone64 is None:
                self._float64_clone()
            if self._clone64 is False:
                return None
            if self._grad64 is None:
                user = self._user_loss(self._clone64)
                if self.keras.backend.backend() == "torch":
                    self._grad64 = _torch_grad(user)
                else:
                    self._grad64 = _jit_rare(jax, jax.grad(user))
            tv, ntv = full
            wide = [np.asarray(v, dtype=np.float64) for v in tv]
            b64 = jax.tree_util.tree_map(
                lambda x: x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x,
                batch)
            g64 = [np.asarray(x) for x in self._grad64(wide, [np.asarray(v) for v in ntv], b64)]
            if any(x.dtype != np.float64 for x in g64):
                self._clone64 = False
                self._why_uncalibrated = "the float64 clone's gradient is not float64 " \
                    "(summed_loss casts: write it with keras.ops)"
                return None
            return self.layout.host(g64)

    def _g32(self, full, batch):
        """g_j in the model's own precision (its kept coordinates): the
        summed loss's gradient through the model itself at the whole state
        the step saw (the output path's reference for how far float32 alone
        strays from float64 on this micro-batch; compiled only where
        asked)."""
        if self._grad32 is None:
            user = self._user_loss(self.net)
            if self.keras.backend.backend() == "torch":
                self._grad32 = _torch_grad(user, lambda: getattr(self, "_rng_before", None))
            else:
                self._grad32 = _jit_rare(self.jax, self.jax.grad(user))
        tv, ntv = full
        g = self._grad32([np.asarray(v) for v in tv], [np.asarray(v) for v in ntv], batch)
        return self.layout.host([np.asarray(x) for x in g])

    # ---- output and failure

    def _tool_version(self):
        return "accumcheck_jax-%s keras-%s (%s backend) jax-%s" % (
            VERSION, self.keras.__version__, self.keras.backend.backend(), self.jax.__version__)

    def _recorder_meta(self):
        rows = [("replay", "the parameters after the previous step + the update call's change "
                           "against the parameters after it (Keras applies the update inside "
                           "its train step): nothing else may move them in the window"),
                ("recorder", self._torch_recorder_row() if self.keras.backend.backend() == "torch"
                 else ("accumcheck_jax.KerasRecorder: taps in Keras's own train step "
                       "(c_j and y_pred's cotangent from its backward; the parameters, "
                       "accumulator, lr and optimizer state its update leaves), g_j's "
                       "weight read at the outputs (keras_taps.py)" if self.tapped_fit else
                       "accumcheck_jax.KerasRecorder: a program of its own before each "
                       "train step of fit (the step's state and batch)")
                 + "; %d coordinates kept of the parameters" % self.layout.d)]
        if self._clone64 is False:
            rows.append(("calibration", "none: " + self._why_uncalibrated))
        if self.notes:  # the output path's (outputs.Outputs._off) and the taps'
            rows.append(("notes", " | ".join(self.notes)))
        return rows

    def _refuse_softly(self, message):
        """Bad input met once fit runs: the recording ends saying so (certify
        exits 2 naming it); the run goes on unrecorded."""
        self._abandon("the recorder refused: " + message)
        sys.stderr.write("accumcheck_jax: not recording: %s\n" % message)

    def _fail(self, e):
        """An error of the recorder's: the recording ends with it; the run
        goes on (its train function restored)."""
        if isinstance(e, Refused):
            self._refuse_softly(e.message)
        else:
            self._abandon("the recorder failed: %s" % describe(e))
            sys.stderr.write("accumcheck_jax: the recorder failed, not recording: %s\n"
                             % describe(e))
        self._queue = []
        self._torch_end()
        if self._orig is not None:
            self.net.train_function = self._orig
        self._remove_taps()
