"""accumcheck_jax's output path: g_j taken from your own backward instead
of a second gradient (issue 46: recording at most 1.5x the plain run).

    apply = rec.apply(model_apply)    # your forward, wrapped: use it in
                                      # summed_loss and in your own loss

Your loss reaches the parameters through the wrapped forward's outputs,
so the gradient your function returns is c_j = J^T u_j (u_j: the
cotangent your loss sends into the outputs), and it is w_j g_j exactly
when u_j = w_j s_j, s_j the summed loss's cotangent at the same outputs.
The wrapper is a jax.custom_vjp whose backward hands u_j and the outputs
to the host (on jax's CPU backend the native tap, an XLA FFI call:
native.py; elsewhere a pure_callback), whose int zero is added to the
bits of the smallest parameter gradient it returns: the values
unchanged, the tap kept on your gradient's path; the
recorder takes s_j through the summed loss alone (its forward replaced
by those outputs: a program the size of the outputs) and fits w_j and
its residual there.  Every calibrate_every-th micro-batch (the first
included) checks the premise on the parameters, against g_j in float32
(float64 only where they stray past the fixed bound: _premise):
|c_j / w_j - g_j| / |g_j| is that micro-batch's calibration; over the
bound (the loss reaches the parameters by another path: a penalty on the
weights, a second forward) every micro-batch from it on takes the full
path (a second gradient), with a note in meta.csv."""

import functools
import math
import weakref

import numpy as np
from accumcheck_trace.error_model import CONTRACT_FIT_CALIBRATION
from accumcheck_trace.trace import Refused

from . import native
from .capture import _enable_x64, _is_nnx, _jit_rare, _pack, dot, norm

# s_j's program runs once a micro-batch: compiled at XLA's default level
# where the outputs hold at least this many elements, else lean
# (capture.RARE: a small output's program compiles faster and runs as
# fast).  Measured on one CPU, jax 0.10.2, the first call (compilation
# included) then a call: a decoder's 2 x 64 x 1024 logits 0.17 s then
# 0.23 ms at the default level, 0.06-0.08 s then 0.67-1.00 ms lean (the
# default pays after 100-250 micro-batches); 2 x 64 x 8192, 0.19-0.21 s
# then 3.0 ms against 0.07 s then 6.3 ms; 16 x 4, 0.11 s then 0.013 ms
# against 0.09 s then 0.015 ms (never pays).
_S_FULL_AT = 1 << 16

# oracle/error_model.hpp evidence_weight_rel (certify reads a weight to
# this precision): how far c_j / w_j may stray from g_j before the loss
# is taken to reach the parameters by another path than the outputs
# (accumcheck_torch's _premise_bound, float32 models).
EVIDENCE_WEIGHT_REL = 1e-3
U32 = 2.0 ** -24


def _int_like(jnp, dtype):
    return {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}.get(jnp.dtype(dtype).itemsize)


def _fit_dots(flat):
    """fit_dots of the device program's vector (us, ss, rr per output):
    "zero" where s is zero."""
    fit = fit_dots([tuple(float(x) for x in flat[i:i + 3]) for i in range(0, len(flat), 3)])
    return "zero" if fit is None else fit


def fit_dots(dots):
    """(w, relative residual) of u = w s over every output from each
    output's (u.s, s.s, |u - (u.s / s.s) s|^2), or None where s is zero."""
    us = sum(d[0] for d in dots)
    ss = sum(d[1] for d in dots)
    if not ss > 0:
        return None
    w = us / ss
    # Each output's own residual plus its weight's distance from the common one.
    rr = sum(d[2] + (d[0] / d[1] - w) ** 2 * d[1] for d in dots if d[1] > 0)
    wn = abs(w) * ss ** 0.5
    return w, (rr ** 0.5 / wn if wn > 0 else (0.0 if rr == 0 else float("inf")))


def tap_on_gradient(jax, gradient, tap, operands, on_vmap=None):
    """gradient (the parameters' cotangent pytree) with the tap on its
    path: a native.Channel's FFI call, or a host callback tap(int dtype,
    *operands); either returns that dtype's zero, added to the bits of the
    gradient's smallest floating leaf (exact: the values unchanged).  The
    operands themselves and the backward's own work are untouched (a tap
    that changed u_j changed XLA's fusion of the backward, and its
    rounding: measured on the token loop).  A gradient with no
    floating leaf of 2, 4 or 8 bytes is returned as it is, untapped."""
    jnp = jax.numpy
    leaves, tdef = jax.tree_util.tree_flatten(gradient)
    fl = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.floating)
          and _int_like(jnp, x.dtype) is not None]
    if not fl:
        return gradient
    at = min(fl, key=lambda i: leaves[i].size)
    last = leaves[at]
    ints = _int_like(jnp, last.dtype)
    def tapped(*ops):
        if isinstance(tap, native.Channel):
            return tap.zero(ints, ops)
        return jax.pure_callback(functools.partial(tap, np.dtype(ints)),
                                 jax.ShapeDtypeStruct((), ints), *ops)
    # Under jax.vmap (your loss mapping the wrapped forward over examples)
    # the operands are one example's, not the micro-batch's: no tap, and
    # on_vmap() tells the recorder while your program is traced (it takes
    # the full path).  A tap with no batching rule made your program fail.
    tapped = jax.custom_batching.custom_vmap(tapped)

    @tapped.def_vmap
    def _mapped(axis_size, in_batched, *ops):
        if on_vmap is not None:
            on_vmap()
        return jnp.zeros((), ints), False
    zero = tapped(*operands)
    bits = jax.lax.bitcast_convert_type(last, ints) + zero
    leaves[at] = jax.lax.bitcast_convert_type(bits, last.dtype)
    return jax.tree_util.tree_unflatten(tdef, leaves)


def _fit_c(c, g):
    """(w, relative residual) of c = w g by least squares."""
    gg = dot(g, g)
    w = dot(c, g) / gg if gg > 0 else 0.0
    wn = abs(w) * math.sqrt(gg)
    if wn > 0:
        return w, norm(c - w * g) / wn
    return w, 0.0 if not c.any() else float("inf")


class Outputs:
    """ContractRecorder's output path (a mixin: the state lives on the
    recorder, made by _outputs_init)."""

    # _premise: g_j in float32 first, float64 only past the fixed bound.
    _premise_float32_first = True

    def _outputs_init(self):
        self.tapped = False      # rec.apply was called: the output path is on
        self.no_take = False     # the premise failed: the full path from here on
        self.taps = []           # (outputs, cotangents) as the backward handed them
        self.tap_mode = "tap"    # while tracing: "tap", "plain" or "substitute"
        self.subst = None        # the outputs the substitute mode returns
        self.substituted = 0
        self.out_treedef = None
        self.notes = []
        self._take_prog = None   # the kept coordinates of the parameters and of c_j
        self._s_prog = None      # s_j from the outputs
        # s_j's dots taken on the host (the CPU backend: _dots_of)
        self._host_dots = self.jax.default_backend() == "cpu"
        self._grad32 = None      # g_j in the model's precision at a calibration sample (_premise)
        self.traced_grad = False
        self._channel = None     # the native tap's queue (native.py), else a host callback
        self._told_ch = None     # the optimizer updates' (capture._told), else a host callback
        self.tap_kind = None     # how the tap hands u_j over (meta.csv's recorder row)
        self._vmapped = False    # the wrapped forward was traced under jax.vmap
        self.tap_dtypes = set()  # the dtypes of the outputs and cotangents the tap hands over

    def apply(self, fn):
        """Your model's forward fn(params, inputs, ...) -> outputs, wrapped:
        call it in summed_loss and in the loss your gradient function
        differentiates (rec.grad(jax.jit(jax.grad(loss)))), once per
        micro-batch.  The run's values are unchanged (the outputs and their
        gradient are your forward's and backward's own)."""
        if not callable(fn):
            raise Refused("ContractRecorder.apply: expected your model's forward function "
                          "fn(params, inputs) -> outputs, got %s" % type(fn).__name__)
        jax, rec = self.jax, self
        self.tapped = True
        if self.tap_kind is None:
            self._channel, why = self._native_channel()
            self.tap_kind = "an XLA FFI call (native_tap.cc)" if self._channel is not None \
                else "a host callback" + (" (%s)" % why if why else "")

        def tap(dtype, *ou):
            # The host callback's tap (no native tap).  No lock: the main
            # thread may hold the recorder's while it waits for the device
            # (a list's append is atomic; the taps are taken once the
            # programs that made them have run: _taps_for).
            if not rec.traced_grad and not rec.no_take:
                n = len(ou) // 2
                rec.taps.append((ou[:n], ou[n:]))
            return np.zeros((), dtype)

        @jax.custom_vjp
        def wrapped(*args):
            return fn(*args)

        def fwd(*args):
            out, vjp = jax.vjp(fn, *args)
            return out, (vjp, out)

        def bwd(res, u):
            vjp, out = res
            o_leaves, treedef = jax.tree_util.tree_flatten(out)
            u_leaves = jax.tree_util.tree_leaves(u)
            rec.out_treedef = treedef
            rec.tap_dtypes.update(str(x.dtype) for x in o_leaves + u_leaves)
            cts = list(vjp(u))
            cts[0] = tap_on_gradient(jax, cts[0], tap if rec._channel is None else rec._channel,
                                     o_leaves + u_leaves, on_vmap=rec._tap_under_vmap)
            return tuple(cts)

        wrapped.defvjp(fwd, bwd)

        def call(*args):
            if rec.tap_mode == "plain":
                return fn(*args)
            if rec.tap_mode == "substitute":
                rec.substituted += 1
                return rec.subst
            return wrapped(*args)
        return call

    # ---- the eager path's micro-batch on the output path

    def _tap_under_vmap(self):
        self._vmapped = True

    def _output_path(self, first):
        if self._vmapped and self.tapped and not self.no_take:
            self._off("the forward rec.apply wrapped runs under jax.vmap (its outputs one "
                      "example's, not the micro-batch's)")
        return self.tapped and not self.no_take

    def _plain(self, prog, *args):
        """prog(*args), the wrapped forward plain (no tap) where it is traced."""
        mode, self.tap_mode = self.tap_mode, "plain"
        try:
            return prog(*args)
        finally:
            self.tap_mode = mode

    def _eager_outputs(self, first, batch, out, c, state):
        """The eager path's micro-batch on the output path: only the kept
        coordinates of the parameters and of c_j taken on the device (read
        back with the others every few micro-batches); the calibration
        sample's whole state read now, and taken in at once (its premise
        decides the path of the micro-batches after it).  state: the whole
        state's leaves as the call saw them."""
        jax = self.jax
        vec = self._take(first, c, state)
        copy = getattr(vec, "copy_to_host_async", None)
        if copy is not None:
            copy()
        calibrate = self.n_backward % self.calibrate_every == 0
        full = [np.asarray(x) for x in state] if calibrate else None
        self.n_backward += 1
        entry = ("fast", vec, full, jax.device_get(batch))
        with self._lock:
            self.inbox.append(entry)
            self.lazy += 1
        if calibrate:
            self._drain()
        return out

    def _taps_for(self, queued):
        """The taps of the queued micro-batches on the output path, one
        each, in order (their vectors read back: their programs ran)."""
        n = sum(e[0] == "fast" for e in queued)
        taps, self.taps = self.taps, []
        if self._channel is not None:  # their programs ran: their taps are queued
            pulled = self._channel.pull()
            if not self.traced_grad and not self.no_take:  # (outputs, cotangents) each
                taps += [(t[:len(t) // 2], t[len(t) // 2:]) for _, t in pulled]
        if len(taps) == n:
            return iter(taps)
        why = "the wrapped forward's backward ran %d times in %d micro-batches" % (len(taps), n)
        if not all(e[2] is not None for e in queued if e[0] == "fast"):
            self._refuse(why + ": call the function rec.apply returned once per micro-batch, in "
                         "the loss your gradient function differentiates (or record without "
                         "rec.apply)")
        self._off(why + " (once each is the output path's premise)")
        return iter([None] * n)

    def _fits_for(self, queued, taps):
        """The weights of the queued micro-batches on the output path read
        at their outputs, in order: each one's program (s_j and its dot
        products with u_j, on the device) dispatched, then all read back
        at once (3 numbers per output, not s_j; on the CPU backend s_j,
        read in place, and the host takes the dots)."""
        fast = [e for e in queued if e[0] == "fast"]
        dots, on_host = [], []
        for e, tap in zip(fast, taps):
            dots.append(None if tap is None or self.no_take else self._dots_of(tap, e[3]))
            on_host.append(None if dots[-1] is None or not self._host_dots else tap[1])
        got = iter(self.jax.device_get([d for d in dots if d is not None]))
        return iter([None if d is None else _fit_dots(
            np.asarray(next(got)) if u is None else _dots_on_host(u, next(got)))
            for d, u in zip(dots, on_host)])

    def _on_fast(self, p, c, full, batch, fit):
        """A micro-batch on the output path taken in: its weight read at
        the outputs (fit: (w, residual), "zero" or None); a calibration
        sample's premise checked on the parameters (_premise; where it
        fails, fitted against its reference gradient)."""
        j = len(self.micro)
        cal = float("nan")
        if fit == "zero":  # s_j = 0: g_j = J^T s_j = 0
            fit = _fit_c(c, np.zeros_like(c))
        if full is not None and fit is None:  # no weight read: fitted against g_j
            g64 = self._g64(full, batch)
            fit = _fit_c(c, self._g32(full, batch) if g64 is None else g64)
        elif full is not None:
            cal, ref = self._premise(j, c, fit, full, batch)
            if cal is None:
                fit, cal = _fit_c(c, ref), float("nan")
        elif fit is None:
            self._refuse("micro-batch %d: its weight could not be read at the outputs of the "
                         "forward rec.apply wrapped" % j)
        self._on_backward(p, None, c, None, batch, packed=False, fit=fit, cal=cal)

    def _take(self, first, c, state):
        """The kept coordinates of the parameters and of c_j as one vector:
        on the CPU backend read in place (a jax array on the CPU is host
        memory: numpy sees it without a copy, and no program is compiled
        or dispatched); elsewhere a program of the recorder's on the
        device, dispatched like yours (only the kept coordinates cross).
        state: the whole state's leaves as the call saw them (the
        parameters taken among them, not read from first again).  On the
        CPU backend parameters that are the very arrays last read (the
        hand loop's micro-batches of one window: jax arrays never change)
        are not indexed again."""
        jax = self.jax
        c_leaves = jax.tree_util.tree_leaves(c)
        if self._param_at is not None and len(state) == self._param_at[0]:
            p_leaves = [state[i] for i in self._param_at[1]]
            self._layout(p_leaves, None, first)  # the same shapes as the first call's
        else:
            p_leaves, treedef = jax.tree_util.tree_flatten(self._params_of(first))
            self._layout(p_leaves, treedef, first)
            # Where they are among the whole state's leaves, both read from
            # first now (a Flax NNX model's arrays are new after your
            # nnx.jit program): each parameter a leaf of its own there, else
            # read from first each call.
            now = jax.tree_util.tree_leaves(self._state_of(first))
            at = {id(x): i for i, x in enumerate(now)}
            where = [at.get(id(x)) for x in p_leaves]
            self._param_at = (len(state), where) if len(now) == len(state) \
                and len(at) == len(now) and None not in where else None
        if _in_host_memory(p_leaves + c_leaves):
            read = self._p_read
            if read is not None and len(read[0]) == len(p_leaves) and \
                    all(r() is x for r, x in zip(read[0], p_leaves)):
                p = read[1]
            else:
                p = self.layout.host(p_leaves)
                try:
                    self._p_read = ([weakref.ref(x) for x in p_leaves], p)
                except TypeError:  # a leaf that is no array: read each call
                    self._p_read = None
            return np.concatenate([p, self.layout.host(c_leaves)])
        if self._take_prog is None:
            rec = self

            def take(first, c):
                jnp = jax.numpy
                p_leaves, treedef = jax.tree_util.tree_flatten(rec._params_of(first))
                rec._layout(p_leaves, treedef, first)
                return _pack(jnp, rec.layout.take(jnp, p_leaves)
                             + rec.layout.take(jnp, jax.tree_util.tree_leaves(c)))
            if self.nnx_graph is None and _is_nnx(first):
                from flax import nnx
                self._take_prog = nnx.jit(take)
            else:
                self._take_prog = jax.jit(take)
        return self._take_prog(first, c)

    def _dots_of(self, tap, batch):
        """Dispatches micro-batch j's program: s_j, the summed loss's
        gradient at the outputs (the forward replaced by them, its
        parameters zeros: read only through it), and per output u.s, s.s
        and |u - (u.s / s.s) s|^2 in float64, on the device (the program
        traced in jax's float64 scope: the outputs keep their dtype, s_j
        is the summed loss's own in their precision).  On the CPU backend
        the program is s_j alone and the host takes the dots
        (_dots_on_host): u_j is on the host already (the tap handed it
        over), s_j is read in place, and a program without the float64
        dots compiles in 0.085 s against 0.14 s (measured: s_j of a
        16 x 4 output).  None where summed_loss does not call the wrapped
        forward once (the note said so; the full path from here on)."""
        jax = self.jax
        outputs = jax.tree_util.tree_unflatten(self.out_treedef, list(tap[0]))
        try:
            if self._host_dots:
                return self._s_program(outputs)(outputs, batch)
            with _enable_x64(jax):
                return self._s_program(outputs)(outputs, list(tap[1]), batch)
        except _NotOneForward as e:
            self._off("summed_loss called the wrapped forward %d times (once is the output "
                      "path's premise)" % e.args[0])
            return None

    def _s_program(self, outputs=None):
        """s_j's program (compiled at its first call; outputs: the first
        micro-batch's, whose size decides how, see _S_FULL_AT)."""
        jax = self.jax
        if self._s_prog is None:
            rec = self
            shapes = self.state_shapes

            host = self._host_dots

            def s_dots(outputs, *u_batch):
                u, batch = u_batch if not host else (None, u_batch[0])
                jnp = jax.numpy
                # The parameters (a Flax NNX model: its whole state) zeros:
                # read only through the forward, which the outputs replace.
                params = jax.tree_util.tree_unflatten(
                    rec.treedef, [jnp.zeros(s, d) for s, d in shapes])
                if rec.nnx_graph is not None:
                    from flax import nnx
                    params = nnx.merge(rec.nnx_graph, params)

                def loss(o):
                    mode = rec.tap_mode
                    rec.tap_mode, rec.subst, rec.substituted = "substitute", o, 0
                    try:
                        value = rec.summed_loss(params, batch)
                    finally:
                        rec.tap_mode, rec.subst = mode, None
                    if rec.substituted != 1:
                        raise _NotOneForward(rec.substituted)
                    return value
                s = jax.tree_util.tree_leaves(jax.grad(loss)(outputs))
                if host:
                    return s
                out = []
                for s_leaf, u_leaf in zip(s, u):
                    s64 = jnp.reshape(s_leaf, (-1,)).astype(jnp.float64)
                    u64 = jnp.reshape(u_leaf, (-1,)).astype(jnp.float64)
                    ss, us = s64 @ s64, u64 @ s64
                    w = jnp.where(ss > 0, us / jnp.where(ss > 0, ss, 1.0), 0.0)
                    r = u64 - w * s64
                    out += [us, ss, r @ r]
                return jnp.stack(out) if out else jnp.zeros(0, jnp.float64)
            size = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(outputs))
            self._s_prog = jax.jit(s_dots) if size >= _S_FULL_AT else _jit_rare(jax, s_dots)
        return self._s_prog

    def _taps_held(self):
        """The bytes the native tap holds, not yet taken."""
        return self._channel.held() if self._channel is not None else 0

    def _close_taps(self):
        """The native queues freed, their channels forgotten (the recording ended)."""
        for ch in (getattr(self, "_channel", None), getattr(self, "_told_ch", None)):
            if ch is not None:
                ch.close()

    def _told_channel(self):
        """While an optimizer update is traced: the native channel its
        values go through (capture._told), on jax's CPU backend where the
        native tap loads; None (a host callback) elsewhere, and where your
        gradient function is traced into your program (its micro-batches
        then arrive by an ordered callback, which an update told later,
        at the recorder's next pull, would overtake)."""
        if self.traced_grad:
            return None
        if self._told_ch is None:
            self._told_ch, _ = self._native_channel()
        return self._told_ch

    def _native_channel(self):
        """(a new native.Channel, None) on jax's CPU backend (the default
        backend: a program there has no accelerator to run on) where the
        native tap loads; else (None, why not: None off the CPU backend,
        where the operands are on the device and a host callback hands
        them over)."""
        if self.jax.default_backend() != "cpu":
            return None, None
        lib, why = native.library(self.jax)
        return (native.Channel(self.jax, lib), None) if lib is not None else (None, why)

    def _take_told(self):
        """The updates whose programs were launched so far have run, and
        what they told is taken in (in program order: before any
        micro-batch launched after them)."""
        if self._told_ch is not None:
            self.jax.effects_barrier()
            self._told_ch.told()

    def _mute_taps(self):
        """The native tap's copies stop (the taps are not taken from here on)."""
        if self._channel is not None:
            self._channel.mute()

    def _off(self, why):
        if not self.no_take:
            self.no_take = True
            self._mute_taps()
            self.notes.append("%s: every micro-batch from micro-batch %d on takes the full path "
                              "(a second gradient)" % (why, len(self.micro)))

    def _premise(self, j, c, fit, full, batch):
        """The calibration sample on the output path: c_j / w_j against g_j,
        the summed loss's gradient at the state and batch the micro-batch
        saw.  Returns (calibration, reference): the calibration None where
        the premise failed (the micro-batch then fitted against the
        reference, and the full path from here on).

        First against g_j in the model's own precision (_g32, a program of
        the recorder's: float32 beside your float32), as accumcheck_torch's
        premise backward is: within the fixed bound, the premise holds and
        that distance is the calibration (it bounds the weight fit as a
        float64 distance did: two float32 evaluations of one gradient).
        That costs a float32 gradient's memory, not a float64 copy of the
        parameters and their float64 gradient (16 bytes a parameter,
        measured to make the recorded run's peak on a 124M decoder).

        Past the fixed bound, float64 decides (_g64): float32 itself may
        stray that far (a model near its minimum: g_j small beside the
        per-sample gradients it sums, measured 0.097 of its norm at
        micro-batch 160 of the wide MLP's hand loop), so the premise holds
        where c_j / w_j is within CONTRACT_FIT_CALIBRATION times the
        float32 gradient's own distance from float64 (two float32
        evaluations each about cal_j from float64, as certify bounds the
        fit), and that float64 distance is the calibration.  A recorder
        with no float64 gradient for this model (_g64 None: a Keras model
        that draws random numbers) holds the fixed bound alone, and the
        sample stays uncalibrated (meta.csv's `calibration` row says why).
        A Keras recorder (_premise_float32_first False) asks float64 first,
        as before (keras_fit.py says why)."""
        bound = max(EVIDENCE_WEIGHT_REL, 16 * U32)
        g32 = None
        if self._premise_float32_first:
            g32 = self._g32(full, batch)
            lin = _premise_distance(c, fit, g32)
            if lin <= bound:
                return lin, g32
        g64 = self._g64(full, batch)
        if g64 is None:
            g32 = self._g32(full, batch) if g32 is None else g32
            lin = _premise_distance(c, fit, g32)
            if lin <= bound:
                return float("nan"), g32
            return self._premise_failed(j, lin), g32
        lin = _premise_distance(c, fit, g64)
        if lin > bound and np.isfinite(lin):
            g32 = self._g32(full, batch) if g32 is None else g32
            n64 = norm(g64)
            bound = max(bound, CONTRACT_FIT_CALIBRATION * norm(g32 - g64) / n64)
        if lin > bound:
            return self._premise_failed(j, lin), g64
        return lin, g64

    def _premise_failed(self, j, lin):
        """The premise failed on micro-batch j: noted, the full path from
        here on; None (no calibration)."""
        self._off("micro-batch %d: the gradient of its backward is not the outputs' "
                  "gradient carried back (%.3g of its norm apart): the loss reaches the "
                  "parameters by another path" % (j, lin))


def _premise_distance(c, fit, g):
    """|c_j / w_j - g| / |g| (inf where w_j is 0 and g is not; 0 where g is 0)."""
    n = norm(g)
    if fit[0] == 0 or n == 0:
        return float("inf") if n > 0 else 0.0
    return norm(c / fit[0] - g) / n


# _dots_on_host's block: its float64 buffers stay in the cache, where
# whole float64 copies of a language model's logits (2 x 64 x 8192 at 10M:
# 8 MB each, seven of them) cost page faults and memory traffic.
_DOT_BLOCK = 1 << 15


def _dots_on_host(u, s):
    """_s_program's dots on the host, in float64 (summed by numpy, not the
    BLAS: capture.dot): per output u.s, s.s and |u - (u.s / s.s) s|^2.
    Taken a block at a time through three float64 buffers of _DOT_BLOCK
    (pairwise sums within a block, the blocks' sums added in order): 14.5
    -> 4.0 ms a call on a 10M decoder's logits and their cotangent
    (2 x 64 x 8192, measured), each sum within 5e-16 of math.fsum's."""
    out = []
    for u_leaf, s_leaf in zip(u, s):
        uf = np.asarray(u_leaf).reshape(-1)
        sf = np.asarray(s_leaf).reshape(-1)
        n = uf.size
        bu, bs, bt = (np.empty(min(n, _DOT_BLOCK)) for _ in range(3))
        blocks = [(a, min(_DOT_BLOCK, n - a)) for a in range(0, n, _DOT_BLOCK)]
        us = ss = 0.0
        for a, m in blocks:
            x, y, t = bu[:m], bs[:m], bt[:m]
            x[...], y[...] = uf[a:a + m], sf[a:a + m]
            us += dot(x, y, t)
            ss += dot(y, y, t)
        w = us / ss if ss > 0 else 0.0
        rr = 0.0
        for a, m in blocks:
            x, y, t = bu[:m], bs[:m], bt[:m]
            x[...], y[...] = uf[a:a + m], sf[a:a + m]
            np.subtract(x, np.multiply(y, w, out=t), out=t)
            rr += dot(t, t, t)
        out += [us, ss, rr]
    return np.asarray(out, dtype=np.float64)


def _in_host_memory(leaves):
    """The leaves are jax arrays on the CPU backend (numpy reads them in
    place, once computed), as the first says: a choice of speed only
    (numpy reads a leaf elsewhere correctly, by a copy), so one leaf is
    asked, not each (a decoder's 104 leaves cost 1.4 ms a micro-batch
    asked one by one)."""
    devices = getattr(leaves[0], "devices", None) if leaves else None
    return devices is not None and all(d.platform == "cpu" for d in devices())


class _NotOneForward(Exception):
    pass
