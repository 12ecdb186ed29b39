"""accumcheck_jax's inbox: what the programs told (the eager path's
micro-batches, whose kept coordinates wait on the device, and the
callbacks of the gradient function and the optimizer's update), taken in
in program order (a mixin of ContractRecorder).

A callback that arrives while nothing waits is taken in at once; else it
queues behind what waits, and _drain reads the micro-batches' vectors
back from the device together, every _INBOX_BYTES or at a sync."""

import functools
import weakref

import numpy as np
from accumcheck_trace.heap import heap_trim

from .capture import _is_nnx, _pack

# The eager path's micro-batches waiting on the device to be read back
# (their kept coordinates, and on the output path the outputs and
# cotangents the taps handed over): read back together once they hold
# this many bytes, or at the epoch's end.  The taps count: a decoder's
# logits and their cotangent are 8 MB a micro-batch at a vocabulary of
# 8192, 51 MB at GPT-2's 50,257, and up to sixteen of them were held
# until the next calibration (the 10M decoder's peak at K = 4: 1,331-1,400
# MB with them counted, 1,427-1,460 MB before).
_INBOX_BYTES = 16 << 20


# The event jax.monitoring reports for each program XLA compiles
# (jax._src.dispatch.BACKEND_COMPILE_EVENT).
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class _Compiles:
    """Whether jax compiled a program (yours or the recorder's) since the
    recorder last asked: a listener on jax.monitoring's compile event.
    Compiling is where glibc's heap grows in pieces (the compiler's
    working memory freed around the buffers a program keeps), and the
    heap the recorded run kept then made most of its peak above the plain
    run's (docs/frameworks-jax-keras.md, memory); once nothing compiles,
    a run's heap holds steady.  Where jax has no such listener, as if
    every micro-batch followed a compilation."""

    def __init__(self, jax):
        self.since = True  # the first micro-batch: nothing seen yet
        self._listener = None
        mon = getattr(jax, "monitoring", None)
        register = getattr(mon, "register_event_duration_secs_listener", None)
        self.always = register is None
        if self.always:
            return

        def listener(event, duration, **kwargs):
            if event == _COMPILE_EVENT:
                self.since = True
        register(listener)
        self._listener = (mon, listener)

    def take(self):
        seen, self.since = self.since, False
        return seen or self.always

    def close(self):
        """The listener removed (where this jax can remove one)."""
        if self._listener is not None:
            mon, listener = self._listener
            self._listener = None
            remove = getattr(mon, "unregister_event_duration_listener", None)
            if remove is not None:
                try:
                    remove(listener)
                except Exception:  # noqa: BLE001 - jax's own bookkeeping: nothing to do
                    pass


def _held(taps):
    """The bytes of the outputs and cotangents the taps hold."""
    return sum(getattr(x, "nbytes", 0) for tap in list(taps) for part in tap for x in part)


class Inbox:
    def _eager(self, fn, value_and_grad, first, batch, a, k, state):
        """The wrapped gradient function called outside jit (your jitted
        function wrapped: rec.grad(jax.jit(fn))): your function as it is,
        then one program of the recorder's own (g_j, and the kept
        coordinates of the parameters, of g_j and of your gradient, as one
        vector), dispatched asynchronously like yours and read back with
        the others every few micro-batches: no callback in your program
        (a program with one leaves jax's fast dispatch path), and no wait
        for the device per micro-batch."""
        jax = self.jax
        # The optimizer updates your loop launched before this call have
        # told (their callbacks, queued behind the micro-batches not yet
        # read back): the order of what the inbox holds is program order.
        # An update tells from the program that makes the parameters this
        # call takes (a callback whose result is in its state: see _told).
        # Parameters that are the very arrays of the last wait were made by
        # no program since: nothing to wait for (the hand loop's K - 1
        # micro-batches of each window).  On the CPU backend the update
        # tells by the native tap (native.py), taken here once
        # jax.effects_barrier() has waited for its program (_take_told:
        # what an update whose parameters are not used next told, too);
        # with host callbacks instead, such a program runs in the thread
        # that dispatches it (measured), so the update has told before
        # this call and the wait finds its parameters ready: 2.4 us of CPU
        # for the wait and the barrier (measured on the wide MLP's 4
        # leaves); Flax NNX, whose parameters are new arrays at every
        # call, pays that each micro-batch.
        if not self._same_arrays(state):
            jax.block_until_ready(state)
            jax.effects_barrier()
            try:
                self._waited = [weakref.ref(x) for x in state]
            except TypeError:  # a leaf that is no array (a Python number): wait each call
                self._waited = None
        self._take_told()
        if self.lazy and self.lazy * 3 * self.layout.d * 4 + _held(self.taps) + \
                self._taps_held() >= _INBOX_BYTES:
            self._drain()
        # The C heap's free pages handed back before your forward
        # (accumcheck_trace.heap) when jax compiled a program since the last
        # micro-batch (_Compiles): not every micro-batch, as each trim makes
        # your next forward fault its working set in again (the 10M
        # decoder: 1.8x your step's CPU trimmed every micro-batch).
        if self._compiles.take():
            heap_trim()
        out = fn(first, batch, *a, **k)
        c = out[1] if value_and_grad else out
        if self._output_path(first):
            return self._eager_outputs(first, batch, out, c, state)
        if self._probe is None:
            rec = self

            def probe(first, batch, c):
                g = rec.grad_transform(rec.summed_loss)(first, batch)
                p_leaves, treedef = jax.tree_util.tree_flatten(rec._params_of(first))
                rec._layout(p_leaves, treedef, first)
                jnp = jax.numpy
                take = rec.layout.take
                return _pack(jnp, take(jnp, p_leaves) + take(jnp, jax.tree_util.tree_leaves(g))
                             + take(jnp, jax.tree_util.tree_leaves(c)))
            if self.nnx_graph is None and _is_nnx(first):
                from flax import nnx
                self._probe = nnx.jit(probe)
            else:
                self._probe = jax.jit(probe)
        vec = self._plain(self._probe, first, batch, c)
        copy = getattr(vec, "copy_to_host_async", None)
        if copy is not None:
            copy()
        # The calibration sample's whole state, read now (your next program
        # may donate its buffers).
        if self.n_backward % self.calibrate_every == 0:
            full = [np.asarray(x) for x in state]
        else:
            full = None
        self.n_backward += 1
        entry = ("lazy", vec, full, jax.device_get(batch))  # not under the lock: it may wait
        with self._lock:
            self.inbox.append(entry)
            self.lazy += 1
        return out

    def _same_arrays(self, leaves):
        """leaves are the very arrays of the last wait, all alive (weak
        references: the recorder keeps no parameters alive)."""
        seen = self._waited
        return seen is not None and len(seen) == len(leaves) and \
            all(r() is x for r, x in zip(seen, leaves))

    def sync_calls(self):
        """The callbacks of the programs launched so far have run, and what
        they and the micro-batches told is taken in."""
        self.jax.effects_barrier()
        self._take_told()
        self._drain()

    def _arriving(self, handler):
        """handler as a callback's function: taken in at once when nothing
        told before it waits in the inbox, else queued behind it.  One
        function per handler, the same at every trace: jax compiles a
        program anew for a call of another function (the native tap's site,
        capture._Told), which had an optimizer update called outside jit
        compiled at every step."""
        fn = self._arrivals.get(handler)
        if fn is None:
            fn = self._arrivals[handler] = functools.partial(self._arrive, handler)
        return fn

    def _arrive(self, handler, *args):
        """Inside your program's host callback: an error here ends the
        recording (_fail), never your program."""
        if self.closed:
            return
        try:
            with self._lock:
                if handler == self._on_backward:
                    self.n_backward += 1
                if not self.inbox and not self.draining:
                    handler(*args)
                else:
                    self.inbox.append(("now", handler, args))
        except Exception as e:  # noqa: BLE001 - the run goes on, unrecorded
            self._fail(e)

    def _drain(self):
        """Takes in what the inbox holds, in order: the micro-batches'
        vectors read back from the device together; a callback that
        arrives meanwhile waits its turn behind them."""
        while True:
            with self._lock:
                queued, self.inbox, self.lazy = self.inbox, [], 0
                self.draining = bool(queued)
            if not queued:
                return
            try:
                d = self.layout.d
                vecs = iter(self.jax.device_get([e[1] for e in queued
                                                 if e[0] in ("lazy", "fast")]))
                fits = self._fits_for(queued, self._taps_for(queued))
                for e in queued:
                    if e[0] == "lazy":
                        v = np.asarray(next(vecs))
                        self._on_backward(v[:d], v[d:2 * d], v[2 * d:], e[2], e[3], packed=False)
                    elif e[0] == "fast":
                        v = np.asarray(next(vecs))
                        self._on_fast(v[:d], v[d:], e[2], e[3], next(fits))
                    else:
                        e[1](*e[2])
            except BaseException:
                with self._lock:
                    self.draining = False
                raise
