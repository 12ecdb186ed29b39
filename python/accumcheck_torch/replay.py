"""The contract recorder's replay (ContractRecorder's replay part): each
step's update against PyTorch's own optimizer class, replayed from the
recorded parameters, state and gradient."""

import copy

import torch

# oracle/error_model.hpp contract_replay_ulps (the judging is certify's; this
# only scales what the trace reports): the one mirror, every recorder's.
from accumcheck_trace.error_model import REPLAY_ULPS, U32

from .guard import _never_raises
from .trace import real

# PyTorch's optimizers whose update of an element reads only that element's
# parameter, gradient and state (and scalars): replayed on the sampled
# coordinates (_replay_step).  Exact classes: a subclass may not be.
ELEMENTWISE = frozenset(getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
    "ASGD", "Rprop") if hasattr(torch.optim, name))


class Replay:
    """The replay of each optimizer step (a mixin of ContractRecorder)."""

    def _replay_step(self, grads):
        """PyTorch's own optimizer class, built once on copies of the
        parameters, stepped from this step's parameters, state and gradient
        (before your step runs): what your step must give.  For an
        optimizer whose update is elementwise (ELEMENTWISE: every state
        shaped like its parameter) the copies hold the recorder's sampled
        coordinates only (flat), each element stepped exactly as in the
        whole tensor; any other optimizer is replayed on whole copies.  The
        copies are views of one flat buffer (the parameters' dtype; float64
        if they mix dtypes), so the comparison is a few whole-vector
        operations and nothing is allocated per step."""
        keys = [p for g in self.optimizer.param_groups for p in g["params"]]
        ours = [self._local(p) for p in keys]
        if self.replay is None:
            index = {id(p): i for i, p in enumerate(self.params)}
            sampled = type(self.optimizer) in ELEMENTWISE
            # Per key: how its coordinates are taken (a recorded parameter's
            # sample; everything of a tensor the model does not have, such
            # as DeepSpeed's flat partitions).
            def taker(key, q):
                i = index.get(id(key))
                if not sampled:
                    return lambda t: t
                if i is None:
                    return lambda t: t.reshape(-1)
                return self._param_take(i, q)
            takes = [taker(k, q) for k, q in zip(keys, ours)]
            shapes = [take(q).shape for take, q in zip(takes, ours)]
            dts = {p.dtype for p in ours}
            dt = dts.pop() if len(dts) == 1 else torch.float64
            total = sum(sh.numel() for sh in shapes)
            flat = torch.zeros(total, dtype=dt, device=ours[0].device if ours else "cpu")
            params, at = [], 0
            for sh in shapes:
                params.append(flat[at:at + sh.numel()].view(sh).requires_grad_(True))
                at += sh.numel()
            groups, at = [], 0
            for g in self.optimizer.param_groups:
                h = {k: v for k, v in g.items() if k != "params"}
                groups.append(dict(h, params=params[at:at + len(g["params"])]))
                at += len(g["params"])
            self.replay = (type(self.optimizer)(groups), params, flat,
                           torch.zeros_like(flat), torch.zeros_like(flat), torch.zeros_like(flat),
                           [torch.zeros_like(p) for p in params], takes)
        opt, params, flat, before, now, tmp, gbuf, takes = self.replay
        for g, mine in zip(opt.param_groups, self.optimizer.param_groups):
            for k, v in mine.items():
                if k != "params":
                    g[k] = v
        dsts, srcs = [], []  # copied in one foreach call
        for p, key, q, take in zip(params, keys, ours, takes):
            st = self.optimizer.state.get(key)
            if not st:
                opt.state.pop(p, None)
                continue
            mine = opt.state.get(p)
            if mine is None or set(mine) != set(st):
                mine = opt.state[p] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    v = self._local(v)
                    # A state shaped like its parameter is taken as it is;
                    # a scalar (Adam's step) whole.
                    v = take(v) if v.shape == q.shape else v
                    if k in mine and torch.is_tensor(mine[k]) and mine[k].shape == v.shape \
                            and mine[k].dtype == v.dtype:
                        dsts.append(mine[k])
                        srcs.append(v)
                    else:
                        mine[k] = v.clone()
                else:
                    mine[k] = copy.deepcopy(v)
        got = {id(q): g for q, g in zip(self.params, grads)}
        for key in keys:
            # An optimizer stepping tensors other than the model's (DeepSpeed's
            # flat float32 partitions) is replayed on their own gradients.
            got.setdefault(id(key), key.grad)
        with torch.no_grad():
            for p, key, q, b, take in zip(params, keys, ours, gbuf, takes):
                dsts.append(p)
                srcs.append(take(q))
                g = got.get(id(key))
                g = None if g is None else self._local(g)
                if g is None:
                    p.grad = None
                else:
                    dsts.append(b)
                    srcs.append(take(g))
                    p.grad = b
            torch._foreach_copy_(dsts, srcs)
            if self.step_scale is not None:
                # The replay is told no scale: it steps the unscaled gradient.
                for b in gbuf:
                    b.div_(self.step_scale)
            before.copy_(flat)
        opt.step()

    def _param_take(self, i, q):
        """How the replay takes recorded parameter i's coordinates of a
        tensor shaped like q (as the optimizer steps it): its sample, or
        all of a tensor shaped otherwise (a sharding recorder takes the
        sampled coordinates in its shard)."""
        if q.shape != self.params[i].shape:
            return lambda t: t.reshape(-1)
        return lambda t: self.buf.take(i, t)

    @_never_raises
    def _after_step(self):
        """Your update against the replay: |p - p_replay| within 16 u32 of
        |p_replay| + |update| (error model: contract_replay_ulps), in the
        parameters' precision: |p - p_replay| is exact there (Sterbenz) and
        the bound needs no more than a few digits."""
        if self.step_found_inf:
            return  # a fused step GradScaler skipped: scaler.py spends its index
        if self.overflowed:
            self.overflowed = False
            self._window_spent(None)  # stepped on inf/NaN: not replayed
            return
        opt, params, flat, before, now, tmp, gbuf, takes = self.replay
        ours = [self._local(p) for g in self.optimizer.param_groups for p in g["params"]]
        at = 0
        with torch.no_grad():
            for q, take in zip(ours, takes):
                t = take(q)
                now[at:at + t.numel()].copy_(t.reshape(-1))
                at += t.numel()
            torch.sub(flat, before, out=tmp).abs_().add_(flat.abs()).mul_(REPLAY_ULPS * U32)
            now.sub_(flat).abs_()
            hit = now > 0
            worst = float((now[hit] / tmp[hit]).max()) if bool(hit.any()) else 0.0
        self.rows.append("replay,%d,,,,,,%s,,\n" % (self.steps, real(worst * REPLAY_ULPS)))
        self.steps += 1
        for b in self.since_step:
            self.backwards[b][2] = None  # fitted; its row is free again
        self.since_step = []
        self._progress(write=True)
