"""KerasRecorder's taps inside Keras's own JAX train step (a mixin of
keras_fit.KerasRecorder): the output path (outputs.py) for `model.fit`.

Keras's JAX train step differentiates model.compute_loss_and_updates
with respect to its first argument (the trainable values), which calls
model.stateless_call(...) for y_pred and then the loss; it hands the
gradient to model.optimizer.stateless_apply and y_pred to
model.compute_metrics, whose logs leave the step.  The step is traced at
its first call, after on_train_begin, so wrappers installed on the model
and optimizer instances there (removed at on_train_end; the train
function made anew both times, so no fit of the user's before or after
runs a step traced with them) put the taps in the step itself:
  - u_j, the cotangent Keras's loss sends into y_pred, from the step's
    own backward: the step's input carries a zero probe z shaped as
    y_pred after the trainable values (_with_z), so the step
    differentiates it with them; y_pred passes through a custom_vjp
    identity of (y_pred, z) whose backward hands u_j on unchanged and as
    z's cotangent, so the gradient list ends in u_j (_identity).  Nothing
    is added to the forward or the backward; u_j is only read.  (A
    pure_callback handing u_j to the host, outputs.py's tap, cost about
    0.3 ms of CPU a step on jax 0.10's CPU backend: more than Keras's
    whole step on the example's MLP.)
  - c_j's kept coordinates (the gradient stateless_apply is handed, u_j
    taken off it), then the kept coordinates of the parameters, the
    accumulator and the optimizer's per-variable state the update leaves,
    the lr and the update flag of the next call (_step_vector): one
    vector.
  - the vector, u_j and y_pred leave the step as an extra entry of its
    logs (compute_metrics'), which the train function wrapper removes
    before Keras sees them: no host callback, the arrays stay on the
    device until the queue is read back.
A step's input state is the state the previous step's vector holds
where Keras hands it the arrays that step returned (checked by identity);
otherwise (the first step, a callback that synced and moved the
variables) a program of gathers before the step reads it
(_gather_program: reading the donated input inside the step made XLA
copy every updated buffer whole).
The recorder then takes s_j, summed_loss's gradient at each queued
step's y_pred (one program over the stacked outputs of the steps whose
shapes agree: a program the size of the outputs), and fits u_j = w_j s_j
(outputs.fit_dots); c_j = w_j g_j follows where the loss reaches the
parameters only through y_pred, which outputs.Outputs._premise checks on
every calibrate_every-th step (the first included) against g_j in
float64; where it fails, or where the model has no float64 clone, every
step from then on takes the full path (g_j a gradient of the recorder's
own, keras_fit._make_probe).  No gradient of the parameters is
recomputed on the output path."""

import numpy as np

from .contract import _pack
from .outputs import _dots_on_host, fit_dots

# The logs entry the train step hands the recorder's vector, u_j and
# y_pred out by (removed before Keras's callbacks and History see the logs).
LOGS_KEY = "__accumcheck_step"


def hookable(model, keras):
    """Why the train step of this model cannot carry the taps ("" where it
    can): the step must be Keras's own JAX train step, calling the
    methods the taps wrap."""
    from keras.src.backend.jax.trainer import JAXTrainer
    if type(model).train_step is not JAXTrainer.train_step:
        return "the model's train_step is its own, not Keras's"
    for owner, name in ((model, "compute_loss_and_updates"), (model, "stateless_call"),
                        (model, "compute_metrics"), (model.optimizer, "stateless_apply")):
        if not callable(getattr(owner, name, None)):
            return "this Keras release has no %s.%s" % (type(owner).__name__, name)
    if getattr(model, "jit_compile", True) is False or getattr(model, "run_eagerly", False):
        return "the train step is not jitted (run_eagerly or jit_compile=False)"
    return ""


class KerasTaps:
    def _taps_init(self):
        self.in_step = False    # inside the train step the wrapper calls (its trace)
        self.tap_next = False   # the next stateless_call is the train step's forward
        self.z = None           # while tracing: the probe z (u_j is its gradient)
        self.tapped_trace = False  # while tracing: y_pred went through _identity
        self.step_out = None    # while tracing: stateless_apply's vector and u_j
        self._z = {}            # z (numpy zeros as y_pred), per input shape
        self.hooked = []        # (object, attribute name) the taps were installed as
        self.tapped_fit = False  # the taps were installed (meta.csv says so)
        self.out_tree = None    # y_pred's treedef (the train step's)
        self._s_progs = {}      # s_j of the stacked outputs, per shape

    def _install_taps(self):
        """The wrappers on the model and optimizer instances (removed by
        _remove_taps); the train function made anew, traced with them."""
        model, opt, rec = self.net, self.opt, self
        clu, call, metrics = model.compute_loss_and_updates, model.stateless_call, \
            model.compute_metrics
        apply = opt.stateless_apply

        def compute_loss_and_updates(trainable, *args, **kw):
            rec.tap_next = rec.in_step and bool(kw.get("training"))
            if rec.tap_next:
                # The train step's input carries z after the parameters
                # (_with_z): the probe whose gradient is u_j.
                rec.z, trainable = trainable[-1], trainable[:-1]
            try:
                return clu(trainable, *args, **kw)
            finally:
                rec.tap_next, rec.z = False, None

        def stateless_call(*args, **kw):
            if not rec.tap_next or not kw.get("return_losses"):
                return call(*args, **kw)
            rec.tap_next = False
            out = call(*args, **kw)
            rec.tapped_trace = True
            return (rec._identity(out[0], rec.z),) + tuple(out[1:])

        def stateless_apply(opt_vars, grads, trainable):
            if not rec.in_step:
                return apply(opt_vars, grads, trainable)
            u, grads, trainable = grads[-1], list(grads[:-1]), list(trainable[:-1])
            new_trainable, new_opt_vars = apply(opt_vars, grads, trainable)
            if rec.tapped_trace:
                rec.step_out = (rec._step_vector(grads, new_trainable, new_opt_vars), u)
            return new_trainable, new_opt_vars

        def compute_metrics(x, y, y_pred, *args, **kw):
            logs = metrics(x, y, y_pred, *args, **kw)
            if rec.in_step and rec.step_out is not None:
                vec, u = rec.step_out
                logs = dict(logs, **{LOGS_KEY: (vec, u, y_pred)})
                rec.step_out, rec.tapped_trace = None, False
            return logs
        for owner, name, fn in ((model, "compute_loss_and_updates", compute_loss_and_updates),
                                (model, "stateless_call", stateless_call),
                                (model, "compute_metrics", compute_metrics),
                                (opt, "stateless_apply", stateless_apply)):
            object.__setattr__(owner, name, fn)
            self.hooked.append((owner, name))
        self.tapped_fit = True
        model.make_train_function(force=True)

    def _remove_taps(self):
        if not self.hooked:
            return
        for owner, name in self.hooked:
            if name in vars(owner):
                object.__delattr__(owner, name)
        self.hooked = []
        # The traced step carries the taps: the next fit traces its own.
        self.net.make_train_function(force=True)

    def _identity(self, y_pred, z):
        """y_pred unchanged, through a custom_vjp whose backward hands the
        cotangent u_j Keras's loss sends into y_pred on unchanged and
        also as z's: the train step differentiates z with the parameters
        (_with_z), so its gradient list ends in u_j, from the step's own
        backward.  No operation is added to the forward or the backward
        (u_j is only read: the parameters' gradient and the step's bits
        as without it); no host callback."""
        jax = self.jax

        @jax.custom_vjp
        def identity(y, z):
            return y

        def fwd(y, z):
            return y, None

        def bwd(_, u):
            return u, u
        identity.defvjp(fwd, bwd)
        return identity(y_pred, z)

    def _with_z(self, state, batch):
        """The step's state with z, zeros shaped as y_pred, after the
        parameters (the differentiated list); z's shapes from the model's
        output for this input's shapes (jax.eval_shape, once each)."""
        jax, keras, model = self.jax, self.keras, self.net
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        key = tuple((tuple(np.shape(a)), str(getattr(a, "dtype", ""))) for a in
                    jax.tree_util.tree_leaves(x))
        z = self._z.get(key)
        if z is None:
            kw = {"training": True} if getattr(model, "_call_has_training_arg", True) else {}
            shape = jax.eval_shape(lambda tv, ntv, xs: model.stateless_call(tv, ntv, xs, **kw)[0],
                                   state[0], state[1], x)
            z = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shape)
            self.out_tree = jax.tree_util.tree_structure(shape)
            self._z[key] = z
        return (list(state[0]) + [z],) + tuple(state[1:])

    def _step_vector(self, grads, trainable, opt_vars):
        """In the train step: the kept coordinates of c_j (the gradient
        stateless_apply is handed), then _gathered of the state the
        update leaves (the next step's input: read from the step's
        outputs, not from the buffers it donates, so no copy is added)."""
        jnp = self.jax.numpy
        return _pack(jnp, self.layout.take(jnp, list(grads))
                     + self._gathered(list(trainable), opt_vars))

    def _gathered(self, trainable, opt_vars):
        """The kept coordinates of the parameters and of the accumulator,
        the lr, the update flag (0 or 1: whether the optimizer's counter
        makes the call an update call) and the optimizer state's kept
        values, as the state trainable, opt_vars gives them (one call's
        input)."""
        jax, keras, opt, rec = self.jax, self.keras, self.opt, self
        jnp = jax.numpy
        take = rec.layout.take
        with keras.StatelessScope(state_mapping=list(zip(opt.variables, opt_vars))):
            lr = jnp.asarray(keras.ops.convert_to_tensor(opt.learning_rate), jnp.float32)
        acc = [jnp.zeros_like(p) if i is None else opt_vars[i]
               for p, i in zip(trainable, rec._acc_index)]
        state = [x for lst in rec._slots for x in take(jnp, [opt_vars[i] for i in lst])]
        # Keras's rule: the call its counter makes an update call.
        update = (opt_vars[rec._iter_index] + 1) % rec.K == 0
        return take(jnp, trainable) + take(jnp, acc) + [
            jnp.reshape(lr, (1,)), jnp.reshape(update.astype(jnp.float32), (1,))] + state

    def _gather_program(self):
        """_gathered as a program of its own, dispatched before a tapped
        step whose input is not the state the previous step handed out
        (the first step, or a callback's sync of the variables between
        steps): no gradient, gathers only.  Not taken from the step's own
        input inside it: reading the buffers the step donates and updates
        in place made XLA copy each of them whole (measured: 34 more
        copies of the parameters' size in the compute-bound bench model's
        step, 5 ms of its 14)."""
        jax, rec = self.jax, self

        def gather(trainable, opt_vars):
            return _pack(jax.numpy, rec._gathered(list(trainable), list(opt_vars)))
        from .capture import _jit_rare
        return _jit_rare(jax, gather)

    # ---- s_j and the weights read at the outputs

    def _fits(self, entries):
        """(w, residual) or "zero" per entry (y_pred leaves, u_j leaves,
        host batch), in order: s_j for the entries whose shapes agree in
        one program over their stacked outputs (padded to a fixed count,
        so one shape compiles once), the dots on the host."""
        jax = self.jax
        groups = {}
        for i, (y_pred, _, batch) in enumerate(entries):
            key = (tuple((a.shape, a.dtype.str) for a in y_pred),
                   tuple(None if b is None else tuple((np.shape(x), np.asarray(x).dtype.str)
                                                      for x in jax.tree_util.tree_leaves(b))
                         for b in batch[1:]))
            groups.setdefault(key, []).append(i)
        out = [None] * len(entries)
        for key, idx in groups.items():
            n = len(idx)
            size = max(n, self._stack)
            pick = idx + [idx[-1]] * (size - n)
            y_preds = [np.stack([entries[i][0][k] for i in pick]) for k in range(len(key[0]))]
            ys, sws = [], []
            for at, dest in ((1, ys), (2, sws)):
                first = entries[idx[0]][2][at]
                if first is None:
                    dest.append(None)
                else:
                    dest.append(jax.tree_util.tree_map(
                        lambda *xs: np.stack(xs), *[entries[i][2][at] for i in pick]))
            s = self._s_program(key, size)(y_preds, ys[0], sws[0])
            s = [np.asarray(x) for x in s]
            for row, i in enumerate(idx):
                dots = _dots_on_host(entries[i][1], [x[row] for x in s])
                fit = fit_dots([tuple(float(v) for v in dots[k:k + 3])
                                for k in range(0, len(dots), 3)])
                out[i] = "zero" if fit is None else fit
        return out

    def _s_program(self, key, size):
        prog = self._s_progs.get((key, size))
        if prog is None:
            jax, rec = self.jax, self
            jnp = jax.numpy
            shapes = [(tuple(v.shape), v.dtype) for v in
                      self.net.trainable_variables + self.net.non_trainable_variables]

            def s_one(y_pred_leaves, y, sw):
                # The weights zeros where summed_loss reads them (a
                # regularizer's share): s_j is its gradient at y_pred alone.
                zeros = [jnp.zeros(s, d) for s, d in shapes]
                nt = len(rec.net.trainable_variables)

                def loss(leaves):
                    y_pred = jax.tree_util.tree_unflatten(rec.out_tree, leaves)
                    return rec._summed(rec.summed_loss, zeros[:nt], zeros[nt:], y, y_pred, sw)
                return jax.grad(loss)(list(y_pred_leaves))

            from .capture import _jit_rare
            prog = _jit_rare(jax, jax.vmap(s_one, in_axes=(0, 0, 0)))
            self._s_progs[(key, size)] = prog
        return prog
