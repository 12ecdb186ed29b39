"""accumcheck_jax's float64 calibration: g_j again in float64 on the
host for the calibration sample (every calibrate_every-th micro-batch),
from the whole state that micro-batch saw (a mixin of ContractRecorder)."""

import numpy as np

from .capture import _enable_x64, _jit_rare, norm


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
        micro-batch saw (host numpy leaves) and its batch."""
        jax = self.jax
        with _enable_x64(jax):
            if self._grad64 is None:
                if self.nnx_graph is not None:
                    from flax import nnx
                    self._grad64 = nnx.jit(self.grad_transform(self.summed_loss))
                else:
                    self._grad64 = _jit_rare(jax, self.grad_transform(self.summed_loss))
            wide = [x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x
                    for x in full]
            first = self._first_of(wide)
            b64 = jax.tree_util.tree_map(
                lambda x: x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x,
                batch)
            g64 = self._plain(self._grad64, first, b64)
            return self.layout.host(jax.tree_util.tree_leaves(g64))

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
