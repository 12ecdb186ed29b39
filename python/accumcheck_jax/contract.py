"""The contract tier's recorder for JAX: optax (hand accumulation,
optax.MultiSteps), Flax NNX (nnx.Optimizer), jitted or not, on the CPU.
It writes the same contract trace as accumcheck_torch.ContractRecorder
(docs/trace-format.md), judged by `accumcheck certify --contract`.

    rec = ContractRecorder(summed_loss, items, accumulation=K, out="trace/")
    grad_fn = rec.grad(jax.grad(mean_loss))          # your micro-batch gradient
    tx = rec.optimizer(optax.inject_hyperparams(optax.adam)(learning_rate=1e-3))
    for epoch in range(E):
        for batch in rec.watch(batches):             # your batches, the same
            ...                                      # your loop, unchanged
    rec.close(params)                                # the trained parameters

    summed_loss(params, batch) -> the SUM of the item losses of the batch
    items(batch) -> its loss-bearing items (host numpy batch)

optax.MultiSteps: wrap the whole, rec.optimizer(optax.MultiSteps(inner, K))
(its inner optimizer built with optax.inject_hyperparams).  Flax NNX:
ContractRecorder(..., grad=nnx.grad), the micro-batch
gradient nnx.grad(loss)(model, batch) wrapped by rec.grad, and
nnx.Optimizer(model, rec.optimizer(tx), wrt=nnx.Param); its call wrapped
as any forward, rec.apply(lambda model, x: model(x)), for the output path.

What it measures (jitted or not):
  - with rec.apply(forward) (outputs.py): g_j read from your own backward
    at the forward's outputs, no second gradient; else
  - per micro-batch j (each call of the wrapped gradient function): g_j =
    grad(summed_loss) at the parameters that call saw (in a program of the
    recorder's beside yours, its vector read back with the others every
    few micro-batches; or, your function jitted with the wrapper, in your
    program, handed over by an ordered io_callback), and c_j, the gradient your function returned, fitted as w_j g_j
    (the weight and the relative residual); every calibrate_every-th (the
    first included) g_j again in float64 on the host, which calibrates the
    fit (|g32 - g64| / |g64|);
  - per call of the wrapped optimizer's update (a call in its program,
    capture._told: the native tap on the CPU backend, else a host
    callback): the gradient handed to it
    (what the accumulation consumed), the update it returned and its lr
    (optax.inject_hyperparams' state, or a Keras optimizer's); a call is an
    optimizer step when the next parameters seen differ from those before
    it (optax.MultiSteps runs its inner update at every mini-step and
    discards all but the window's last), and the step's update is checked
    against the parameters seen next (p + update, optax.apply_updates);
  - the consumed gradient fitted by least squares over the previous step's
    gradient and the micro-batch gradients since it.
Memory stays small: every vector is kept on d coordinates per parameter
leaf (all of a leaf of at most `coordinates` elements, default 4096, else
a seeded sample of that many), in float64 numpy on the host.
"""

# keras_fit.py imports _enable_x64, _Leaves and _pack from here (the noqa
# below).  The recorder's parts, a mixin each: inbox.py (what the programs
# told, taken in in program order), steps.py (micro-batches and steps:
# the fits and the replay), outputs.py (g_j at the forward's outputs),
# calibrate.py (g_j in float64), write.py (the trace).
import sys
import threading

from accumcheck_trace.trace import (
    SCHEDULE_KEYS,
    VERSION,
    Recording,
    Refused,
    describe,
    stopped_by,
)

from .calibrate import Calibrate
from .capture import _enable_x64, _host_call, _is_nnx, _jax, _Leaves, _lr_of, _pack, _told  # noqa: F401
from .inbox import Inbox, _Compiles
from .outputs import Outputs
from .steps import Steps
from .write import write


class ContractRecorder(Outputs, Calibrate, Inbox, Steps):
    """ContractRecorder(summed_loss, count_fn, accumulation, out="trace",
    items="samples", run="trainer", lr=None, schedule=None, clip=None,
    accept=(), calibrate_every=16, coordinates=4096, seed=0, grad=None,
    engine="jax", quiet=False).

    summed_loss(params, batch) (or (model, batch) with grad=nnx.grad): the
    SUM of the batch's item losses; count_fn(batch): its loss-bearing items,
    called on the host with numpy arrays; accumulation: K.  lr and
    schedule: the accepted lr schedule as for accumcheck_torch (lr a float;
    schedule None (constant) or a named kind {"kind": "constant" | "step" |
    "linear" | "cosine", "warmup", "total", "step_size", "gamma"}).  clip:
    refused (clipping is not recorded for optax yet).  grad:
    the transform taking summed_loss's gradient (default jax.grad)."""

    def __init__(self, summed_loss=None, count_fn=None, accumulation=None, out="trace",
                 items="samples", run="trainer", lr=None, schedule=None, clip=None, accept=(),
                 calibrate_every=16, coordinates=4096, seed=0, grad=None, engine="jax",
                 quiet=False):
        if summed_loss is None or count_fn is None or accumulation is None:
            raise Refused("accumcheck_jax.ContractRecorder: pass summed_loss (the SUM of a batch's "
                          "item losses: summed_loss(params, batch)), count_fn (its loss-bearing "
                          "items: count_fn(batch)) and accumulation= (K, an integer >= 1)")
        if not callable(summed_loss) or not callable(count_fn):
            raise Refused("accumcheck_jax.ContractRecorder: summed_loss and count_fn must be "
                          "functions, got %s and %s" % (type(summed_loss).__name__,
                                                        type(count_fn).__name__))
        if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
            raise Refused("accumcheck_jax.ContractRecorder: accumulation must be an integer >= 1 "
                          "(the micro-batches per optimizer step), got %r" % (accumulation,))
        if items not in ("samples", "tokens"):
            raise Refused("accumcheck_jax.ContractRecorder: items must be 'samples' or 'tokens', "
                          "got %r" % (items,))
        if isinstance(coordinates, bool) or not isinstance(coordinates, int) or coordinates < 1:
            raise Refused("accumcheck_jax.ContractRecorder: coordinates must be an integer >= 1 "
                          "(the coordinates kept per parameter leaf), got %r" % (coordinates,))
        schedule = dict(schedule or {"kind": "constant"}) if isinstance(schedule, (dict, type(None))) \
            else None
        if schedule is None or sorted(set(schedule) - set(SCHEDULE_KEYS)) or \
                schedule.get("kind") not in ("constant", "step", "linear", "cosine"):
            raise Refused("accumcheck_jax.ContractRecorder: schedule: expected None or {'kind': "
                          "'constant' | 'step' | 'linear' | 'cosine', 'warmup', 'total', "
                          "'step_size', 'gamma'} (a scenario's [schedule] table)")
        if clip is not None:
            raise Refused("accumcheck_jax.ContractRecorder: clip=%r: clipping is not recorded for "
                          "optax yet (the gradient rec.optimizer(...) reads is the one before an "
                          "optax.clip_by_global_norm in its chain, and no clip factor is taken): "
                          "leave clip= out; the weights, lr and update are judged, the clip is "
                          "not" % (clip,))
        if lr is not None and not isinstance(lr, (int, float)):
            raise Refused("accumcheck_jax.ContractRecorder: lr must be a number (the base lr of "
                          "the declared schedule), got %s" % type(lr).__name__)
        self.jax = _jax()
        self.summed_loss, self.count_fn = summed_loss, count_fn
        self.K, self.out, self.items_kind, self.run = accumulation, out, items, run
        self.lr_declared, self.schedule = lr, schedule
        self.clip_max = None if clip is None else float(clip)
        self.accept = [accept] if isinstance(accept, str) else list(accept or ())
        self.calibrate_every = max(1, int(calibrate_every))
        self.coordinates, self.seed = coordinates, seed
        self.grad_transform = grad or self.jax.grad
        self.engine, self.quiet = engine, quiet
        self.layout = None       # _Leaves, fixed by the first gradient seen
        self.treedef = None
        self.state_shapes = None  # the whole state's leaves (shape, dtype), as treedef holds them
        self.nnx_graph = None    # an NNX model's graphdef (calibration rebuilds it)
        self.micro = []          # [epoch, version, items, samples, calibration]
        self.backward = []       # (weight, residual)
        self.c = {}              # backward -> its c (kept coordinates) until its step
        self.since = []          # backward passes since the last step
        self.prev = None         # the gradient the last step consumed
        self.pending = None      # an update call not yet known to be a step
        self.p_last = None       # the kept coordinates of the parameters last seen
        self.steps = 0
        self.rows = []           # step, coef, replay rows
        self.events = []         # (kind, step, micro, lr)
        self.epochs = []         # [dataset size, batch size]
        self.calibrate = []      # (j, full parameter leaves, batch, g32 kept)
        self._grad64 = None      # the float64 gradient, jitted once
        self._probe = None       # the eager path's program (_eager)
        self._waited = None      # weak references to the parameters of the last wait
        self._param_at = None    # where the parameters are among the whole state's leaves
        self._p_read = None      # (weak references, kept coordinates) of the last parameters read
        self._marked = 0.0       # when the marker was last rewritten
        self.lr0 = None
        self.lr_precision = "float32"  # optax's inject_hyperparams holds it so
        self.dtype = None
        self.closed = False
        # What the programs told, in program order, not yet taken in: the
        # eager path's micro-batches ("lazy": their probe's vector still
        # on the device, read back together) and the callbacks that came
        # after one of them.
        self.inbox = []
        self.lazy = 0
        self.n_backward = 0      # micro-batches told so far (taken in or not)
        self.draining = False
        self._lock = threading.Lock()
        self._outputs_init()
        self._compiles = _Compiles(self.jax)  # when to hand the heap back (inbox.py _eager)
        self._arrivals = {}      # handler -> its callback function (inbox.py _arriving)
        self._recording = Recording(out, on_exit=self._abandon)

    # ---- wiring

    def grad(self, fn, value_and_grad=False):
        """Your micro-batch gradient function fn(params, batch, ...) -> grads
        (value_and_grad=True: -> (value, grads)), recorded at each call,
        under jit or not.  Returns the function to call instead."""
        if not callable(fn):
            raise Refused("ContractRecorder.grad: expected your gradient function (e.g. "
                          "jax.grad(loss)), got %s" % type(fn).__name__)
        jax, rec = self.jax, self

        def wrapped(first, batch, *a, **k):
            if rec.closed:  # the recording ended (or failed): your function alone
                return fn(first, batch, *a, **k)
            # The whole state's leaves, read once a call (a Flax NNX
            # model's nnx.state costs about 0.1 ms): _eager waits on them,
            # takes the parameters among them and a calibration sample's.
            state = jax.tree_util.tree_leaves(rec._state_of(first))
            if not any(isinstance(x, jax.core.Tracer)
                       for x in state + jax.tree_util.tree_leaves(batch)):
                try:
                    return rec._eager(fn, value_and_grad, first, batch, a, k, state)
                except Exception as e:  # noqa: BLE001 - the run goes on, unrecorded
                    rec._fail(e)
                    # Your function's own error (if it was one) reaches you from it.
                    return fn(first, batch, *a, **k)
            out = fn(first, batch, *a, **k)
            if value_and_grad:
                if not isinstance(out, (tuple, list)) or len(out) != 2:
                    raise Refused("ContractRecorder.grad(value_and_grad=True): the function "
                                  "returned %s, expected (value, grads)" % type(out).__name__)
                c = out[1]
            else:
                c = out
            rec.traced_grad = True
            rec._mute_taps()
            g = rec._plain(rec.grad_transform(rec.summed_loss), first, batch)
            params = rec._params_of(first)
            p_leaves, treedef = jax.tree_util.tree_flatten(params)
            g_leaves = jax.tree_util.tree_leaves(g)
            c_leaves = jax.tree_util.tree_leaves(c)
            if len(c_leaves) != len(p_leaves) or len(g_leaves) != len(p_leaves):
                raise Refused("ContractRecorder.grad: the gradient has %d leaves, the parameters "
                              "%d: the function must return the gradient of the parameters it "
                              "takes first" % (len(c_leaves), len(p_leaves)))
            rec._layout(p_leaves, treedef, first)
            jnp = jax.numpy
            full = jax.tree_util.tree_leaves(rec._state_of(first))
            rec.full_shapes = [(tuple(x.shape), x.dtype) for x in full]
            # Few arguments: each costs the callback a transfer of its own.
            _host_call(jax, rec._arriving(rec._on_backward),
                       _pack(jnp, rec.layout.take(jnp, p_leaves)),
                       _pack(jnp, rec.layout.take(jnp, g_leaves)),
                       _pack(jnp, rec.layout.take(jnp, c_leaves)), _pack(jnp, full), batch)
            return out
        return wrapped

    def optimizer(self, tx):
        """An optax GradientTransformation (the one that applies the update:
        your optimizer, or an optax.MultiSteps) wrapped so that each
        update call records the gradient handed to it, the update and the
        lr.  Build it with optax.inject_hyperparams so its lr can be read."""
        if not hasattr(tx, "init") or not hasattr(tx, "update"):
            raise Refused("ContractRecorder.optimizer: expected an optax GradientTransformation "
                          "(init and update), got %s" % type(tx).__name__)
        import optax
        jax, rec = self.jax, self
        if isinstance(tx, optax.MultiSteps):
            return self._multi_steps(tx)

        def update(grads, state, params=None, **extra):
            updates, new_state = tx.update(grads, state, params, **extra)
            lr = _lr_of(new_state)
            rec.lr_precision = "float64" if lr is not None and jax.numpy.asarray(lr).dtype == \
                jax.numpy.float64 else "float32"
            if lr is None:
                raise Refused("ContractRecorder.optimizer: the lr of this optimizer cannot be read: "
                              "build it with optax.inject_hyperparams, e.g. "
                              "optax.inject_hyperparams(optax.adamw)(learning_rate=...)")
            jnp = jax.numpy
            g_leaves = jax.tree_util.tree_leaves(grads)
            u_leaves = jax.tree_util.tree_leaves(updates)
            rec._same_tree(g_leaves)
            new_state = _told(jax, rec._arriving(rec._on_update), new_state,
                              _pack(jnp, rec.layout.take(jnp, g_leaves)),
                              _pack(jnp, rec.layout.take(jnp, u_leaves)), lr,
                              channel=rec._told_channel())
            return updates, new_state
        return optax.GradientTransformation(tx.init, update)

    def _same_tree(self, g_leaves):
        """An update's gradient is of the parameters the gradient function saw."""
        if self.layout is None or len(g_leaves) != len(self.layout.picks):
            raise Refused("ContractRecorder.optimizer: an update before any recorded gradient "
                          "(or of another parameter tree): call the function rec.grad(...) "
                          "returned for every micro-batch")

    def _multi_steps(self, tx):
        """optax.MultiSteps, recorded from outside: a callback on what it
        consumes inside (its inner update's input) changes how XLA fuses
        that update, and so the run's rounding.  Its state going in (the
        accumulator acc_grads, mini_step, gradient_step) and what comes out
        are the program's own inputs and outputs: the consumed gradient of
        the window's last mini-step is that accumulator and the last
        micro-batch gradient combined by MultiSteps' rule (use_grad_mean:
        acc + (g - acc) / (mini_step + 1); else acc + g), in the
        accumulator's precision; a step is a call after which
        gradient_step moved."""
        import optax
        jax, rec = self.jax, self
        mean = bool(getattr(tx, "_use_grad_mean", True))

        def update(grads, state, params=None, **extra):
            updates, new_state = tx.update(grads, state, params, **extra)
            lr = _lr_of(new_state.inner_opt_state)
            if lr is None:
                raise Refused("ContractRecorder.optimizer: the lr of MultiSteps' inner optimizer "
                              "cannot be read: build it with optax.inject_hyperparams, e.g. "
                              "optax.MultiSteps(optax.inject_hyperparams(optax.adamw)"
                              "(learning_rate=...), K)")
            jnp = jax.numpy
            g_leaves = jax.tree_util.tree_leaves(grads)
            rec._same_tree(g_leaves)
            take = rec.layout.take
            new_state = _told(jax, rec._arriving(rec._on_multi_step), new_state,
                              _pack(jnp, take(jnp, g_leaves)),
                              _pack(jnp, take(jnp, jax.tree_util.tree_leaves(state.acc_grads))),
                              state.mini_step, state.gradient_step, new_state.gradient_step,
                              _pack(jnp, take(jnp, jax.tree_util.tree_leaves(updates))), lr,
                              channel=rec._told_channel())
            return updates, new_state
        self._multi_mean = mean
        return optax.GradientTransformation(tx.init, update)

    def watch(self, batches, dataset_size=-1, batch_size=-1):
        """Your epoch's batches, the same, in order: one epoch.  Returns an
        iterator over them."""
        self.epoch(dataset_size, batch_size)
        yield from batches

    def epoch(self, dataset_size=-1, batch_size=-1):
        """An epoch starts (the alternative to watch())."""
        if self.closed:
            return
        try:
            self.sync()
        except Exception as e:  # noqa: BLE001 - the run goes on, unrecorded
            self._fail(e)
            return
        self.epochs.append([int(dataset_size), int(batch_size)])

    def sync(self):
        """Every callback of the computations launched so far has run, and
        the float64 calibrations pending are done."""
        self.sync_calls()
        self._calibrate()

    def close(self, params=None):
        """Writes the trace.  params (or the NNX model): the trained
        parameters, which show whether the last update was applied."""
        if self.closed:
            return
        why = stopped_by()
        if why:
            self._abandon(why)
            return
        if params is not None:  # the last update has told (its program made them)
            self.jax.block_until_ready(self.jax.tree_util.tree_leaves(self._state_of(params)))
        try:
            self.sync()
        except Exception as e:  # noqa: BLE001 - a failure while taking in: no trace, no raise
            self._fail(e)
            return
        if self.pending is not None:
            if params is None:
                self._refuse("ContractRecorder.close: pass the trained parameters "
                             "(rec.close(params), or the NNX model): the last update's "
                             "application is judged from them")
            leaves = self.jax.tree_util.tree_leaves(self._params_of(params))
            self._resolve(self.layout.host(leaves))
        if not self.micro:
            self._refuse("ContractRecorder.close: no micro-batch gradient was recorded: call the "
                         "function rec.grad(...) returned for each micro-batch")
        self.closed = True
        self._release()
        write(self)
        self._recording.done()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- what the program tells

    def _params_of(self, first):
        if _is_nnx(first):
            from flax import nnx
            return nnx.state(first, nnx.Param)
        return first

    def _state_of(self, first):
        if _is_nnx(first):
            from flax import nnx
            return nnx.state(first)
        return first

    def _layout(self, p_leaves, treedef, first):
        shapes = [tuple(x.shape) for x in p_leaves]
        if self.layout is None:
            self.layout = _Leaves(shapes, self.coordinates, self.seed)
            self.shapes = shapes
            self.p_dtypes = [x.dtype for x in p_leaves]
            self.dtype = str(p_leaves[0].dtype)
            if _is_nnx(first):
                from flax import nnx
                self.nnx_graph = nnx.graphdef(first)
                state = self.jax.tree_util.tree_leaves(nnx.state(first))
                self.treedef = self.jax.tree_util.tree_structure(nnx.state(first))
            else:
                state = p_leaves
                self.treedef = treedef
            # The whole state's leaves (shape, dtype): what the treedef holds.
            self.state_shapes = [(tuple(x.shape), x.dtype) for x in state]
        elif shapes != self.shapes:
            raise Refused("ContractRecorder.grad: parameters of other shapes than the first "
                          "call's (one model per recorder)")

    # ---- output (write.py)

    def _tool_version(self):
        return "accumcheck_jax-%s jax-%s" % (VERSION, self.jax.__version__)

    def _recorder_meta(self):
        """meta.csv's rows saying how this recorder measured (replay, recorder)."""
        told = "the native tap" if self._told_ch is not None else "a host callback"
        outputs = "; g_j read at the outputs of the forward rec.apply wrapped (outputs.py), " \
            "the tap %s" % self.tap_kind if self.tapped else ""
        return [("replay", ("each step's update against the parameters seen next "
                            "(p + update, as optax.apply_updates adds it)")),
                ("recorder", "accumcheck_jax: the gradient function (rec.grad: a program of "
                             "the recorder's beside yours, or an ordered io_callback in it) and "
                             "the optimizer's update (rec.optimizer: a call in its program, %s); "
                             "%d coordinates kept of the parameters%s" % (told, self.layout.d,
                                                                           outputs))] + \
            ([("notes", " | ".join(self.notes))] if self.notes else [])

    def _fail(self, e):
        """An error met while your loop runs (the recorder's own, or bad
        input it meets then: a count_fn that fails, a second model): the
        recording ends saying why, in its marker (certify exits 2 naming
        it) and on stderr; the run goes on unrecorded, as KerasRecorder's
        fit does."""
        why = ("the recorder refused: " + e.message) if isinstance(e, Refused) \
            else "the recorder failed: %s" % describe(e)
        self._abandon(why)  # a refusal has ended it already, with the same words
        sys.stderr.write("accumcheck_jax: not recording: %s\n" % why)

    def _refuse(self, message):
        self._abandon("the recorder refused: " + message)
        raise Refused(message)

    def _release(self):
        """What the recording holds outside itself let go: the native
        queues (outputs.py _close_taps), jax's compile listener."""
        self._close_taps()
        self._compiles.close()

    def _abandon(self, why):
        self._release()
        if not self.closed:
            self.closed = True
            self._recording.end(why)
