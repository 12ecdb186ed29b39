"""accumcheck_jax's calibration: g_j again for the calibration sample
(every calibrate_every-th micro-batch), from the whole state that
micro-batch saw, in float64 (the full path's calibration, and the output
path's premise where float32 is past its bound) or in the model's own
precision (the output path's premise check), only its kept coordinates
returned (a mixin of ContractRecorder)."""

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
        with _enable_x64(self.jax):
            if self._grad64 is None:
                self._grad64 = self._kept_gradient(wide=True)
            return np.asarray(self._plain(self._grad64, list(full), batch), dtype=np.float64)

    def _g32(self, full, batch):
        """g_j in the model's own precision (its kept coordinates) from the
        whole state the micro-batch saw: the output path's premise check
        (outputs._premise) and the reference where a weight cannot be read.
        The same program as _g64's without the widening, compiled lean
        like it (it runs once every calibrate_every micro-batches), a Flax
        NNX model's too, and only the kept coordinates leave it."""
        if self._grad32 is None:
            self._grad32 = self._kept_gradient(wide=False)
        return np.asarray(self._plain(self._grad32, list(full), batch), dtype=np.float64)

    def _kept_gradient(self, wide):
        """The program (leaves, batch) -> the kept coordinates of the
        gradient of summed_loss at the state those leaves make (a Flax NNX
        model merged from them inside), its floating inputs widened to
        float64 first where wide."""
        jax, rec = self.jax, self

        def kept(leaves, batch):
            jnp = jax.numpy
            if wide:
                def widen(x):
                    return x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x
                leaves = [widen(x) for x in leaves]
                batch = jax.tree_util.tree_map(widen, batch)
            g = rec.grad_transform(rec.summed_loss)(rec._first_of(leaves), batch)
            return _pack(jnp, rec.layout.take(jnp, jax.tree_util.tree_leaves(g)))
        return _jit_rare(jax, kept)

    def _first_of(self, leaves):
        """The first argument of summed_loss from the whole state's leaves:
        the parameters, or a Flax NNX model rebuilt."""
        state = self.jax.tree_util.tree_unflatten(self.treedef, leaves)
        if self.nnx_graph is not None:
            from flax import nnx
            return nnx.merge(self.nnx_graph, state)
        return state
