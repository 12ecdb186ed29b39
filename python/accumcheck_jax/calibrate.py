"""accumcheck_jax's float64 calibration: g_j again in float64 on the
host for the calibration sample (every calibrate_every-th micro-batch),
from the whole state that micro-batch saw (a mixin of ContractRecorder)."""

import numpy as np

from .capture import _enable_x64, _jit_rare, _pack, norm


class Calibrate:
    def _calibrate(self):
        """g_j in float64 on the host for the calibration sample."""
        if not self.calibrate:
            return
        queued, self.calibrate = self.calibrate, []
        for j, full, batch, g32 in queued:
            g64 = self._g64(full, batch)
            n64 = norm(g64)
            self.micro[j][4] = norm(g32 - g64) / n64 if n64 > 0 else 0.0

    def _g64(self, full, batch):
        """g_j in float64 (its kept coordinates) from the whole state the
        micro-batch saw (host numpy leaves) and its batch.  One program of
        the recorder's, compiled once: the state and the batch widened to
        float64 inside it (exact) and only the kept coordinates of the
        gradient returned, so the host neither converts the state (4.6 ms
        of the wide MLP's 26 ms a calibration, measured) nor reads back
        and indexes a float64 copy of every parameter."""
        jax = self.jax
        with _enable_x64(jax):
            if self._grad64 is None:
                rec = self

                def grad64(leaves, batch):
                    jnp = jax.numpy

                    def wide(x):
                        return x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) \
                            else x
                    first = rec._first_of([wide(x) for x in leaves])
                    g = rec.grad_transform(rec.summed_loss)(first, jax.tree_util.tree_map(wide,
                                                                                         batch))
                    return _pack(jnp, rec.layout.take(jnp, jax.tree_util.tree_leaves(g)))
                self._grad64 = _jit_rare(jax, grad64)
            return np.asarray(self._plain(self._grad64, list(full), batch), dtype=np.float64)

    def _g32(self, full, batch):
        """g_j in the model's own precision (its kept coordinates), the full
        path's second gradient, from the whole state the micro-batch saw:
        the output path's reference for how far float32 alone strays from
        float64 on this micro-batch (compiled only where asked)."""
        jax = self.jax
        if self._grad32 is None:
            if self.nnx_graph is not None:
                from flax import nnx
                self._grad32 = nnx.jit(self.grad_transform(self.summed_loss))
            else:
                self._grad32 = _jit_rare(jax, self.grad_transform(self.summed_loss))
        g32 = self._plain(self._grad32, self._first_of(list(full)), batch)
        return self.layout.host(jax.tree_util.tree_leaves(g32))

    def _first_of(self, leaves):
        """The first argument of summed_loss from the whole state's leaves:
        the parameters, or a Flax NNX model rebuilt."""
        state = self.jax.tree_util.tree_unflatten(self.treedef, leaves)
        if self.nnx_graph is not None:
            from flax import nnx
            return nnx.merge(self.nnx_graph, state)
        return state
