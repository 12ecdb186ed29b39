"""accumcheck_jax's steps: what the programs told taken in (a mixin of
ContractRecorder).  Per micro-batch its items and c_j fitted as w_j g_j;
per optimizer update the pending call, resolved against the parameters
seen next: a step when they moved, its consumed gradient fitted by least
squares over the previous step's gradient and the micro-batch gradients
since it, and its update replayed (p + update, optax.apply_updates)."""

import time

import numpy as np

# oracle/error_model.hpp contract_replay_ulps (certify judges; this scales
# what the trace reports): the one mirror, accumcheck_torch's too.
from accumcheck_trace.error_model import REPLAY_ULPS, U32
from accumcheck_trace.trace import real

from .capture import _unpack, join, lstsq, norm
from .outputs import _fit_c
from .write import _off_bf16


class Steps:
    def _on_multi_step(self, g, acc, mini, before, after, u, lr):
        if int(after) == int(before):
            return  # a mini-step: accumulated, nothing applied
        g32 = np.asarray(g, dtype=np.float32)
        a32 = np.asarray(acc, dtype=np.float32)
        if self._multi_mean:
            G = a32 + (g32 - a32) / np.float32(int(mini) + 1)
        else:
            G = a32 + g32
        self._on_update(G, u, lr)

    def _on_backward(self, p, g, c, full, batch, packed=True, fit=None, cal=float("nan")):
        p = join([p])
        if self.pending is not None:
            self._resolve(p)
        self.p_last = p
        g, c = join([g]), join([c])
        j = len(self.micro)
        batch = self.jax.tree_util.tree_map(np.asarray, batch)
        try:
            items = int(self.count_fn(batch))
        except Exception as e:
            self._refuse("count_fn(batch) failed on micro-batch %d: %s" % (j, e))
        first = self.jax.tree_util.tree_leaves(batch)
        samples = int(first[0].shape[0]) if first and np.ndim(first[0]) else 1
        self.micro.append([max(len(self.epochs) - 1, 0), self.steps, items, samples, float("nan")])
        if not self.epochs:
            self.epochs.append([-1, -1])
        if fit is not None:  # read at the outputs (outputs.py)
            w, resid = fit
            self.micro[j][4] = cal
        else:
            if j % self.calibrate_every == 0:
                self.calibrate.append((j, _unpack(full, self.full_shapes) if packed else full,
                                       batch, g))
            w, resid = _fit_c(c, g)
        self.backward.append((w, resid))
        self.c[j] = c
        self.since.append(j)
        self.events.append(("forward_backward", self.steps, j, None))
        self._recording.progress(self.steps, len(self.backward), write=False)

    def _on_update(self, g, u, lr):
        if self.pending is not None:
            self._refuse("two optimizer updates with no micro-batch gradient between them: "
                         "call the function rec.grad(...) returned for each micro-batch")
        if self.p_last is None:
            self._refuse("an optimizer update before any micro-batch gradient")
        self.pending = (join([g]), join([u]), float(lr), self.p_last)

    def _resolve(self, p_now):
        """The pending update call: a step when the parameters moved (or
        when the recorder knows it applied: a fifth element True).  An
        update of zeros (lr 0: a warmup from 0, as
        optax.warmup_cosine_decay_schedule(0.0, ...) starts) moves nothing
        whether applied or not; its state went on into the next call, so it
        is a step, never a discarded call."""
        G, u, lr, p_before = self.pending[:4]
        applied = len(self.pending) > 4 and self.pending[4]
        self.pending = None
        if not applied and u.any() and np.array_equal(p_now, p_before):
            return  # computed and discarded (an inner optimizer's mini-steps)
        t = self.steps
        if self.lr0 is None:
            self.lr0 = float(self.lr_declared) if self.lr_declared is not None else lr
        refs = ([-1] if self.prev is not None else []) + list(self.since)
        terms = ([self.prev] if self.prev is not None else []) + [self.c[b] for b in self.since]
        if terms:
            # Row by row through one row-sized buffer, the unit rows made
            # once and reflected in place by lstsq: the same sums as the
            # whole-matrix expressions, bit for bit, without their
            # matrix-sized temporaries (a K = 16 window of a decoder's
            # 80,640 coordinates: 11 MB each, fresh pages every step).
            A = np.stack(terms)
            buf = np.empty(A.shape[1])
            norms = np.array([norm(a, buf) for a in A])
            safe = np.where(norms > 0, norms, 1.0)
            coef = lstsq(np.divide(A, safe[:, None]), G, overwrite=True) / safe
            fitted = np.multiply(A[0], coef[0])
            for a, x in zip(A[1:], coef[1:]):
                fitted += np.multiply(a, x, out=buf)
            resid = norm(np.subtract(fitted, G, out=fitted))
            scale = float(np.sum(np.abs(coef) * norms))
        else:
            coef, norms, resid, scale = np.zeros(0), np.zeros(0), norm(G), 0.0
        self.rows.append("step,%d,%d,,,%s,,%s,%s,%s\n" % (t, len(refs), _off_bf16(G), real(lr),
                                                          real(resid), real(scale)))
        for ref, a, v in zip(refs, coef, norms):
            self.rows.append("coef,%d,%s,,,,,%s,,%s\n" % (t, ref, real(a), real(v)))
        # The update against the parameters seen next: p + update in the
        # parameters' precision (optax.apply_updates).
        r = (p_before.astype(np.float32) + u.astype(np.float32)).astype(np.float64)
        bound = REPLAY_ULPS * U32 * (np.abs(u) + np.abs(r))
        err = np.abs(p_now - r)
        hit = err > 0
        worst = float(np.max(np.where(bound[hit] > 0, err[hit] / np.where(bound[hit] > 0, bound[hit], 1),
                                      np.inf))) if hit.any() else 0.0
        self.rows.append("replay,%d,,,,,,%s,,\n" % (t, real(worst * REPLAY_ULPS)))
        self.events.append(("optimizer_step", t, -1, lr))
        self.prev = G
        for b in self.since:
            del self.c[b]
        self.since = []
        self.steps += 1
        # The marker (how far a run that dies got) rewritten at most once a
        # second: a rewrite costs a few ms, a small model's step less.
        now = time.monotonic()
        write = now - self._marked >= 1.0
        if write:
            self._marked = now
        self._recording.progress(self.steps, len(self.backward), write=write)
