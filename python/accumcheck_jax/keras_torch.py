"""KerasRecorder on Keras's torch backend (a mixin of keras_fit.KerasRecorder):
a stateful train step (`y_pred = model(x, training=True)`, Keras's loss,
`loss.backward()`, the optimizer's apply), whose backward leaves each
variable's .grad, c_j itself, after the step.  Before it: the parameters,
the accumulator, the counter, the lr and the optimizer's state, read from
the live variables.

g_j by the output path (outputs.py; no forward or backward of the
recorder's own): Keras's loss reaches the parameters through the model's
outputs, so c_j = J^T u_j, u_j the cotangent that loss sends into y_pred,
and c_j = w_j g_j exactly when u_j = w_j s_j, s_j the summed loss's
gradient at the same y_pred.  A forward hook on the model (torch's own:
a Keras torch layer is a torch.nn.Module whose forward is Keras's call)
sees the step's y_pred and puts a gradient hook on it, which reads u_j
during the step's own backward (hooks that return nothing: no value
changes); s_j is the summed loss's gradient at a detached copy of y_pred
(the size of the outputs), and w_j with its residual are fitted there
(outputs.fit_dots).  Every calibrate_every-th step (the first included)
the premise is checked on the parameters against g_j in float64
(Outputs._on_fast -> _premise); a model with no float64 clone (one that
draws random numbers, Dropout or noise: its float64 recompute would draw
others; or one keras.models.clone_model cannot clone) against g_j in
float32 at the state the step saw, drawing from torch's RNG as the step
started (its own masks), uncalibrated.  Where it fails (a
kernel_regularizer: model.losses reach the parameters directly; a loss
that reads the weights), every later step takes the full path, with a
note in meta.csv.

The full path: g_j from a forward and backward of the recorder's own
before the step (the model's non-trainable variables and torch's RNG put
back as they were, so the step draws the masks it would have).  It is
also taken from the step on where the step's forward was not seen once
with its cotangent (a train step that does not call the model once: the
first step shows it)."""

import contextlib
import functools

import numpy as np

from .capture import _Leaves
from .outputs import _dots_on_host, _fit_dots


def _torch_rng(torch):
    """torch's RNG states (CPU, and every CUDA device's once CUDA is up)
    put back as they were when the block ends."""
    up = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if up else [])


def _torch_grad(fn, rng_state=lambda: None):
    """jax.grad(fn) for the torch backend: fn(tv, ntv, batch)'s gradient
    with respect to tv (numpy in, numpy out), torch's RNG put back as it
    was after it; rng_state() -> the CPU RNG state to draw from inside it
    (None: the current one)."""
    import torch

    def grad(tv, ntv, batch):
        ts = [torch.tensor(v, requires_grad=True) for v in tv]
        with _torch_rng(torch), torch.enable_grad():
            state = rng_state()
            if state is not None:
                torch.set_rng_state(state)
            out = fn(ts, [torch.tensor(v) for v in ntv],
                     tuple(None if a is None else torch.tensor(a) for a in batch))
            gs = torch.autograd.grad(out, ts, allow_unused=True)
        return [np.zeros(t.shape) if d is None else d.detach().numpy() for t, d in zip(ts, gs)]
    return grad


@contextlib.contextmanager
def _one_thread(torch):
    """torch's intra-op threads set to one for the block, then put back:
    the recorder's small ops (s_j: the size of the outputs) run inline
    instead of waking the step's worker threads, whose wake-up and spin
    cost more CPU time than the ops (s_j of a 64 x 10 output right after a
    1024 x 1024 matmul: 25 ms of CPU on two threads, 0.9 ms on one,
    measured on a loaded 2-core machine).  The step's own ops run on the
    threads it had."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _host(t):
    return t.detach().cpu().numpy()


class KerasTorch:
    def _torch_begin(self):
        """When fit starts: the forward hook that taps the train step's
        y_pred (inert outside the step: _stepping)."""
        self._taps = []          # (y_pred leaves detached, their cotangents) of the step
        self._stepping = False   # inside the train step the output path records
        self._why_no_tap = ""    # how the step's forward was not seen once (_fit_at_outputs)
        self._hook = self.net.register_forward_hook(self._tap_forward)

    def _torch_end(self):
        """The forward hook removed (fit ended, or the recording did)."""
        hook, self._hook = getattr(self, "_hook", None), None
        if hook is not None:
            hook.remove()

    def _torch_recorder_row(self):
        """meta.csv's `recorder` row on the torch backend."""
        return ("accumcheck_jax.KerasRecorder on Keras's torch backend: the live variables read "
                "before each train step and c_j from .grad after it; g_j read at the model's "
                "outputs (a forward hook: the cotangent of the step's own backward), or where "
                "the notes say so by a forward and backward of the recorder's own; %d "
                "coordinates kept of the parameters" % self.layout.d)

    def _tap_forward(self, module, args, out):
        """The model's forward inside a train step on the output path: its
        outputs kept (detached: the same storage, no graph) and a gradient
        hook on each, which keeps u_j and returns nothing (the backward's
        values unchanged)."""
        if not self._stepping:
            return None
        leaves = self.keras.tree.flatten(out)
        tap = ([t.detach() if hasattr(t, "detach") else t for t in leaves], [None] * len(leaves),
               out)
        self._taps.append(tap)
        for i, t in enumerate(leaves):
            if getattr(t, "requires_grad", False):
                t.register_hook(functools.partial(_keep, tap[1], i))
        return None

    def _torch_fast(self):
        """Whether this step takes the output path: the premise has not
        failed (the float64 clone made before the first step, while the
        variables hold their values)."""
        if self.no_take:
            return False
        if self._clone64 is None:
            self._float64_clone()
        return True

    def _before_torch(self, batch):
        """Before the step: the parameters, the accumulator, the counter and
        the lr it starts from; on the full path g_j from a forward of the
        recorder's own (the model's non-trainable state, its seed
        generators and statistics, put back as it was)."""
        import torch
        keras, model, opt = self.keras, self.net, self.opt
        if self.layout is None:
            # The variables, listed once (Keras walks its layers for each
            # list; the variables of a fitting model stay the same objects).
            self._tv, self._ntv = model.trainable_variables, model.non_trainable_variables
            self._ov = opt.variables
        params = [v.value for v in self._tv]
        if self.layout is None:
            shapes = [tuple(t.shape) for t in params]
            self.layout = _Leaves(shapes, self.coordinates, self.seed)
            self.shapes = shapes
            self.dtype = str(params[0].dtype).replace("torch.", "")
            self._indices()
        p = self.layout.host([_host(t) for t in params])
        x, y, sw = keras.utils.unpack_x_y_sample_weight(batch)
        fast = self._torch_fast()
        g = None
        if not fast:
            kept = [v.value.detach().clone() for v in self._ntv]
            try:
                # torch's own RNG too (an unseeded Dropout draws from it): the
                # train step then draws what it would have, the same masks.
                with _torch_rng(torch), torch.enable_grad():
                    kw = {"training": True} if getattr(model, "_call_has_training_arg", True) else {}
                    loss = self.summed_loss(y, model(x, **kw), sw)
                    g = torch.autograd.grad(loss, params, allow_unused=True)
            finally:
                with torch.no_grad():
                    for v, t in zip(self._ntv, kept):
                        v.value.copy_(t)
            g = self.layout.host([np.zeros(t.shape, np.float32) if d is None else _host(d)
                                  for t, d in zip(params, g)])
        ov = self._ov
        it = int(_host(ov[self._iter_index].value))
        # The accumulator is read on the update calls alone (_record uses it there).
        acc = None if (it + 1) % self.K else self.layout.host(
            [np.zeros(t.shape, np.float32) if i is None else _host(ov[i].value)
             for t, i in zip(params, self._acc_index)])
        lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
        st = self._state_host()
        full = None
        if len(self.micro) % self.calibrate_every == 0:
            full = ([_host(t).copy() for t in params],
                    [_host(v.value).copy() for v in self._ntv])
            # torch's RNG as the step starts: g_j at this state (_g32, the
            # premise's float32 reference) draws the step's own masks.
            self._rng_before = torch.get_rng_state()
        hostb = tuple(None if a is None else self.jax.tree_util.tree_map(
            lambda t: _host(t) if hasattr(t, "detach") else np.asarray(t), a) for a in (x, y, sw))
        self._taps = []
        self._stepping = fast
        return p, g, acc, it, lr, full, hostb, st, (y, sw) if fast else None

    def _after_torch(self, p, g, acc, it, lr, full, hostb, st, fast):
        """After the step: c_j, the .grad train_step's backward left; on the
        output path the weight read at the outputs."""
        self._stepping = False
        params = [v.value for v in self._tv]
        c = self.layout.host([np.zeros(t.shape, np.float32) if t.grad is None
                              else _host(t.grad) for t in params])
        fit = None
        if fast is not None:
            fit = self._fit_at_outputs(fast)
            if fit is None:
                # The step's forward was not seen once with its cotangent:
                # g_j at the state the step saw, by the full path's gradient
                # (the model draws no random numbers: it has a float64 clone).
                if full is None:
                    self._refuse("micro-batch %d: %s" % (len(self.micro), self._why_no_tap))
                self._off(self._why_no_tap + " (once is the output path's premise)")
                g = self._g32(full, hostb)
            elif full is not None and self._grad64 is None and self._clone64 is not False and \
                    self._g64(full, _first_sample(self.jax, hostb)) is None:
                # The clone's float64 gradient, tried on one sample before
                # the first premise needs it: where it is not float64, the
                # full path (meta.csv's `calibration` row says why).
                self._off("the output path's premise cannot be checked against float64 (%s)"
                          % self._why_uncalibrated)
                fit, g = None, self._g32(full, hostb)
        self._record(p, g, c, acc, (it + 1) % self.K == 0, lr, full, hostb, st, fit=fit)

    def _fit_at_outputs(self, ysw):
        """(w_j, residual) of u_j = w_j s_j over the step's outputs ("zero"
        where s_j is zero), s_j the summed loss's gradient at a detached
        copy of y_pred; None where the step's forward was not seen once
        with its cotangent (_why_no_tap says how)."""
        import torch
        taps, self._taps = self._taps, []
        if len(taps) != 1:
            self._why_no_tap = "the train step called the model %d times" % len(taps)
            return None
        outs, us, structure = taps[0]
        if all(u is None for u in us):
            self._why_no_tap = "the train step's backward sent no cotangent into the model's " \
                               "outputs"
            return None
        # An output Keras's loss does not read: its cotangent is zero.
        us = [np.zeros(o.shape, np.float32) if u is None else _host(u) for o, u in zip(outs, us)]
        y, sw = ysw
        with _one_thread(torch), torch.enable_grad():
            leaves = [o.detach().requires_grad_() for o in outs]
            loss = self.summed_loss(y, self.keras.tree.pack_sequence_as(structure, leaves), sw)
            s = torch.autograd.grad(loss, leaves, allow_unused=True)
        s = [np.zeros(o.shape, np.float32) if d is None else _host(d) for o, d in zip(outs, s)]
        return _fit_dots(_dots_on_host(us, s))


def _keep(into, i, u):
    """A gradient hook: keeps the cotangent, changes nothing."""
    into[i] = u.detach()


def _first_sample(jax, batch):
    """The batch's first sample (x, y, sample_weight), numpy."""
    return jax.tree_util.tree_map(lambda a: a[:1] if np.ndim(a) else a, batch)
