"""KerasRecorder on Keras's torch backend (a mixin of keras_fit.KerasRecorder):
a stateful train step, whose backward leaves each variable's .grad, c_j
itself, after the step.  Before it: the parameters, the accumulator, the
counter, the lr and the optimizer's state from the live variables, and
g_j from a forward of the recorder's own (the model's non-trainable
variables and torch's RNG put back as they were, so the step draws the
masks it would have)."""

import numpy as np

from .capture import _Leaves


def _torch_rng(torch):
    """torch's RNG states (CPU, and every CUDA device's once CUDA is up)
    put back as they were when the block ends."""
    up = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if up else [])


def _torch_grad(fn):
    """jax.grad(fn) for the torch backend: fn(tv, ntv, batch)'s gradient
    with respect to tv (numpy in, numpy out)."""
    import torch

    def grad(tv, ntv, batch):
        ts = [torch.tensor(v, requires_grad=True) for v in tv]
        with _torch_rng(torch), torch.enable_grad():
            out = fn(ts, [torch.tensor(v) for v in ntv],
                     tuple(None if a is None else torch.tensor(a) for a in batch))
            gs = torch.autograd.grad(out, ts, allow_unused=True)
        return [np.zeros(t.shape) if d is None else d.detach().numpy() for t, d in zip(ts, gs)]
    return grad


class KerasTorch:
    def _before_torch(self, batch):
        """Before the step: the parameters, the accumulator, the counter and
        the lr it starts from, and g_j from a forward of the recorder's own
        (the model's non-trainable state, its seed generators and
        statistics, put back as it was)."""
        import torch
        keras, model, opt = self.keras, self.net, self.opt
        params = [v.value for v in model.trainable_variables]
        if self.layout is None:
            shapes = [tuple(t.shape) for t in params]
            self.layout = _Leaves(shapes, self.coordinates, self.seed)
            self.shapes = shapes
            self.dtype = str(params[0].dtype).replace("torch.", "")
            self._indices()
        host = lambda t: t.detach().cpu().numpy()  # noqa: E731
        p = self.layout.host([host(t) for t in params])
        x, y, sw = keras.utils.unpack_x_y_sample_weight(batch)
        kept = [v.value.detach().clone() for v in model.non_trainable_variables]
        try:
            # torch's own RNG too (an unseeded Dropout draws from it): the
            # train step then draws what it would have, the same masks.
            with _torch_rng(torch), torch.enable_grad():
                kw = {"training": True} if getattr(model, "_call_has_training_arg", True) else {}
                loss = self.summed_loss(y, model(x, **kw), sw)
                g = torch.autograd.grad(loss, params, allow_unused=True)
        finally:
            with torch.no_grad():
                for v, t in zip(model.non_trainable_variables, kept):
                    v.value.copy_(t)
        g = self.layout.host([np.zeros(t.shape, np.float32) if d is None else host(d)
                              for t, d in zip(params, g)])
        ov = opt.variables
        it = int(host(ov[self._iter_index].value))
        acc = self.layout.host([np.zeros(t.shape, np.float32) if i is None else host(ov[i].value)
                                for t, i in zip(params, self._acc_index)])
        lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
        st = self._state_host()
        full = None
        if len(self.micro) % self.calibrate_every == 0:
            full = ([host(t).copy() for t in params],
                    [host(v.value).copy() for v in model.non_trainable_variables])
        hostb = tuple(None if a is None else self.jax.tree_util.tree_map(
            lambda t: host(t) if hasattr(t, "detach") else np.asarray(t), a) for a in (x, y, sw))
        return p, g, acc, it, lr, full, hostb, st

    def _after_torch(self, p, g, acc, it, lr, full, hostb, st):
        """After the step: c_j, the .grad train_step's backward left."""
        params = [v.value for v in self.net.trainable_variables]
        c = self.layout.host([np.zeros(t.shape, np.float32) if t.grad is None
                              else t.grad.detach().cpu().numpy() for t in params])
        self._record(p, g, c, acc, (it + 1) % self.K == 0, lr, full, hostb, st)
