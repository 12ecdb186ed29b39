"""The contract tier's recorder: certify the gradient accumulation of any
nn.Module, without an export bundle (README "Two tiers of certification").

    recorder = ContractRecorder(model, optimizer, loss_fn=summed_loss, count_fn=items,
                                accumulation=K, out="trace/", items="tokens")
    for epoch in range(E):
        for i, batch in enumerate(recorder.watch(loader)):   # your loop, unchanged
            ...
    recorder.close()
    accumcheck certify --contract trace/

The two functions you write:
    summed_loss(model, batch) -> the SUM of the item losses of the batch
        (reduction="sum"; per-token losses: summed over loss-bearing tokens)
    items(batch) -> the number of loss-bearing items (samples, or tokens
        that are not padding)
Everything else is your own loop, model, optimizer and DataLoader.

What it measures, per micro-batch j (one item of the watched loader):
  - g_j: the gradient of summed_loss at the parameters the micro-batch's
    forward saw, recomputed in float64 on a copy of the model with the same
    batch and the same randomness (the CPU RNG state captured when the
    batch was drawn is replayed, so dropout draws the same masks; the copy
    is in train mode and its BatchNorm running statistics are its own,
    so yours are untouched) -- and the same recompute in float32, whose
    difference to float64 calibrates how far a float32 gradient of this
    micro-batch may honestly stray (cal_j = |g32 - g64| / |g64|; by
    default on one micro-batch per window, the run's largest used for all);
  - per backward pass b (autograd gradient hooks on every parameter, so any
    call style is seen): the gradient c_b it added to .grad, fitted as
    w_b * g_j of the micro-batch drawn last: the weight w_b and the
    relative residual;
  - per optimizer step t: the gradient it consumed, fitted by least squares
    as beta * G_{t-1} + sum_b a_b c_b over the backward passes since the
    previous step (beta: what .grad still held of the previous step's
    gradient: 0 after zero_grad, 1 when never zeroed); the lr; and the
    update, replayed in float64 with PyTorch's own optimizer class from the
    recorded state, in units of u32 of |p| + |update|.
The judging (which g_j with which weight each step holds, against the
coefficient engine's predictions) is `accumcheck certify --contract`.
"""

import copy

import torch

from .trace import TRACE_SCHEMA, VERSION, Refused, real, write_trace

CONTRACT_HEADER = "kind,index,ref,epoch,version,items,samples,value,residual,scale"
U32 = 2.0 ** -24
# oracle/error_model.hpp contract_replay_ulps (the judging is certify's; this
# only scales what the trace reports).
REPLAY_ULPS = 16.0


def _to(batch, dtype):
    """The batch with its floating tensors in `dtype` (indices untouched)."""
    if torch.is_tensor(batch):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, dtype) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, dtype) for k, v in batch.items()}
    return batch


def _rows(batch):
    t = batch
    while not torch.is_tensor(t):
        if isinstance(t, dict):
            t = next(iter(t.values()))
        else:
            t = t[0]
    return int(t.shape[0])


def _first(batch):
    t = batch
    while not torch.is_tensor(t):
        t = next(iter(t.values())) if isinstance(t, dict) else t[0]
    return t


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


class _Watched:
    def __init__(self, rec, loader):
        self.rec, self.loader = rec, loader

    def __iter__(self):
        self.rec._new_epoch(self.loader)
        for batch in self.loader:
            self.rec._drawn(batch)
            yield batch

    def __len__(self):
        return len(self.loader)


class ContractRecorder:
    """ContractRecorder(model, optimizer, loss_fn, count_fn, accumulation,
    out="trace", items="samples", run="trainer", quiet=False,
    calibrate_every=None)."""

    def __init__(self, model, optimizer, loss_fn, count_fn, accumulation, out="trace",
                 items="samples", run="trainer", quiet=False, calibrate_every=None):
        if items not in ("samples", "tokens"):
            raise Refused("items must be 'samples' or 'tokens', got %r" % (items,))
        if int(accumulation) < 1:
            raise Refused("accumulation must be >= 1, got %r" % (accumulation,))
        self.model, self.optimizer = model, optimizer
        self.loss_fn, self.count_fn = loss_fn, count_fn
        self.K, self.out, self.items_kind, self.run = int(accumulation), out, items, run
        # The float32 calibration recompute: every calibrate_every-th
        # micro-batch (default: one per window, K); the others are judged
        # with the largest calibration of the run.
        self.calibrate_every = max(1, int(calibrate_every or self.K))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.n = sum(p.numel() for p in self.params)
        # The float64 and float32 copies the recomputes run on.
        self.m64 = copy.deepcopy(model).double().train()
        self.m32 = copy.deepcopy(model).float().train()
        self.p64 = [p for p in self.m64.parameters() if p.requires_grad]
        self.p32 = [p for p in self.m32.parameters() if p.requires_grad]
        self.first, self.forwarded, self.current = [], [], -1
        self.micro = []        # [epoch, version, items, samples, rng, batch, g64]
        self.backwards = []    # [micro, version, c (float64 flat)]
        self.epochs = []       # [dataset items, batch size] per watched epoch
        self.rows = []         # contract.csv rows
        self.events = []
        self.steps = 0
        self.since_step = []   # backward indices since the last step
        self.prev_grad = None  # float64 flat gradient consumed by the last step
        self.in_backward = False
        self.pass_grads = None
        self.closed = False
        self.quiet = quiet
        self._patch()

    # ---- the loader

    def watch(self, loader):
        """Your DataLoader, yielding the same batches; each iteration over
        it is an epoch."""
        return _Watched(self, loader)

    def _new_epoch(self, loader):
        ds = getattr(loader, "dataset", None)
        self.epochs.append([len(ds) if ds is not None else -1,
                            getattr(loader, "batch_size", None) or -1])

    def _drawn(self, batch):
        self._recompute_pending()
        with torch.no_grad():
            items = int(self.count_fn(batch))
        self.micro.append([len(self.epochs) - 1, self.steps, items, _rows(batch),
                           torch.get_rng_state(), batch, None])
        self.first.append(_first(batch).data_ptr())
        self.forwarded.append(False)
        self.current = len(self.micro) - 1

    def _forward_hook(self, module, inputs):
        """The forward of a drawn batch (matched by its first tensor's
        storage; a loop that prefetches its window draws every batch before
        the first forward): the RNG state its dropout will draw from, and
        the parameter version it sees."""
        if not torch.is_grad_enabled() or not inputs or not torch.is_tensor(inputs[0]):
            return
        ptr = inputs[0].data_ptr()
        for j in range(len(self.micro) - 1, -1, -1):
            if self.first[j] == ptr and not self.forwarded[j]:
                self.forwarded[j] = True
                self.micro[j][4] = torch.get_rng_state()
                self.micro[j][1] = self.steps
                self.current = j
                return

    # ---- hooks

    def _patch(self):
        rec, opt = self, self.optimizer
        orig_step, orig_zero = opt.step, opt.zero_grad

        def step(*a, **k):
            rec._before_step()
            out = orig_step(*a, **k)
            rec._after_step()
            return out

        def zero_grad(*a, **k):
            rec.events.append(("zero_grad", rec.steps, -1))
            return orig_zero(*a, **k)
        if getattr(orig_step, "_with_counter", False):
            step._with_counter = True
        opt.step, opt.zero_grad = step, zero_grad
        self._hooks = [p.register_hook(self._grad_hook(i)) for i, p in enumerate(self.params)]
        self._hooks.append(self.model.register_forward_pre_hook(self._forward_hook))

    def _grad_hook(self, i):
        def hook(grad):
            if not self.in_backward:
                self.in_backward = True
                self.pass_grads = [None] * len(self.params)
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            g = grad.detach().double()
            self.pass_grads[i] = g if self.pass_grads[i] is None else self.pass_grads[i] + g
            return None
        return hook

    def _end_backward(self):
        self.in_backward = False
        c = _flat([torch.zeros(p.numel(), dtype=torch.float64) if g is None else g
                   for p, g in zip(self.params, self.pass_grads)])
        self.pass_grads = None
        if not self.micro:
            raise Refused("a backward pass before any batch was drawn from recorder.watch(loader)")
        self.since_step.append(len(self.backwards))
        self.backwards.append([self.current, self.steps, c])
        self.events.append(("forward_backward", self.steps, self.current))

    # ---- recompute and fit

    def _recompute_pending(self):
        """g_j (float64) and its float32 calibration for every micro-batch
        that had a backward pass and no recompute yet, at the current
        parameters (those of its forward: called before any step)."""
        todo = sorted({b[0] for b in self.backwards if self.micro[b[0]][6] is None})
        if not todo:
            return
        with torch.no_grad():
            for dst64, dst32, src in zip(self.p64, self.p32, self.params):
                dst64.copy_(src)
                dst32.copy_(src)
        keep = torch.get_rng_state()
        for j in todo:
            m = self.micro[j]
            if m[1] != self.steps:
                raise Refused("micro-batch %d: an optimizer step between its forward and its "
                              "recompute" % j)
            gs = []
            runs = [(self.m64, self.p64, torch.float64)]
            if j % self.calibrate_every == 0:
                runs.append((self.m32, self.p32, torch.float32))
            for model, params, dtype in runs:
                torch.set_rng_state(m[4])
                model.zero_grad(set_to_none=True)
                loss = self.loss_fn(model, _to(m[5], dtype))
                loss.backward()
                gs.append(_flat([torch.zeros(p.numel(), dtype=dtype) if p.grad is None
                                 else p.grad.detach() for p in params]).double())
            g64 = gs[0]
            n64 = float(g64.norm())
            m[6] = g64
            if len(gs) > 1:
                m.append(float((gs[1] - g64).norm()) / n64 if n64 > 0 else 0.0)
            else:
                m.append(float("nan"))  # certify uses the run's largest calibration
            m[5] = None  # the batch is no longer needed
        torch.set_rng_state(keep)
        for rec in self.backwards:
            if len(rec) > 3 or rec[0] not in todo:
                continue
            c, g = rec[2], self.micro[rec[0]][6]
            gg = float(g.dot(g))
            w = float(c.dot(g)) / gg if gg > 0 else 0.0
            r = c - w * g
            wn = abs(w) * gg ** 0.5
            resid = float(r.norm()) / wn if wn > 0 else (0.0 if float(c.norm()) == 0 else float("inf"))
            rec.append((w, resid))

    def _before_step(self):
        self._recompute_pending()
        G = _flat([torch.zeros(p.numel(), dtype=torch.float64) if p.grad is None
                   else p.grad.detach().double() for p in self.params])
        vecs, refs = [], []
        if self.prev_grad is not None:
            vecs.append(self.prev_grad)
            refs.append(-1)
        for b in self.since_step:
            vecs.append(self.backwards[b][2])
            refs.append(b)
        t = self.steps
        lr = float(self.optimizer.param_groups[0]["lr"])
        if vecs:
            A = torch.stack(vecs, dim=1)
            # Least squares through the normal equations, scaled to unit
            # columns (m is a handful; the columns' float64 norms keep the
            # Gram matrix far from singular unless two terms are equal).
            norms = A.norm(dim=0).clamp_min(1e-300)
            An = A / norms
            sol = torch.linalg.pinv(An.t() @ An, hermitian=True) @ (An.t() @ G) / norms
            coef = sol.tolist()
            resid = float((A @ sol - G).norm())
            scale = sum(abs(a) * float(v.norm()) for a, v in zip(coef, vecs))
        else:
            coef, resid, scale = [], float(G.norm()), 0.0
        self.rows.append("step,%d,%d,,,,,%s,%s,%s\n" % (t, len(vecs), real(lr), real(resid), real(scale)))
        for ref, a, v in zip(refs, coef, vecs):
            self.rows.append("coef,%d,%d,,,,,%s,,%s\n" % (t, ref, real(a), real(float(v.norm()))))
        self.prev_grad = G
        # State for the float64 replay of this step.
        self._replay = (
            [p.detach().double().clone() for p in self.params],
            copy.deepcopy(self.optimizer.state_dict()),
            [p.grad.detach().double().clone() if p.grad is not None else None
             for p in self.params])

    def _replayed(self, dtype):
        """This step replayed with PyTorch's own optimizer class in `dtype`
        from the recorded parameters, state and gradient."""
        before, state, grads = self._replay
        params = [b.to(dtype).clone().requires_grad_(True) for b in before]
        groups, at = [], 0
        for g in self.optimizer.param_groups:
            h = {k: v for k, v in g.items() if k != "params"}
            groups.append(dict(h, params=params[at:at + len(g["params"])]))
            at += len(g["params"])
        opt = type(self.optimizer)(groups)
        state = copy.deepcopy(state)
        for v in state["state"].values():
            for name, x in list(v.items()):
                if torch.is_tensor(x) and x.is_floating_point() and x.dim() > 0:
                    v[name] = x.to(dtype)
        opt.load_state_dict(state)
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.to(dtype)
        opt.step()
        return [p.detach().double() for p in params]

    def _after_step(self):
        """The update against PyTorch's optimizer replayed in float64; the
        same replay in float32 calibrates how far a float32 step may be
        from it (error model: contract_replay_ulps)."""
        before = self._replay[0]
        p64, p32 = self._replayed(torch.float64), self._replayed(torch.float32)
        worst = 0.0
        for a, b, c, p0, p in zip(p64, p32, before, before, self.params):
            now = p.detach().double()
            bound = (REPLAY_ULPS * U32 * (a.abs() + (a - p0).abs()) + (b - a).abs())
            err = (now - a).abs()
            ok = bound > 0
            if bool((~ok & (err > 0)).any()):
                worst = float("inf")
            elif bool(ok.any()):
                worst = max(worst, float((err[ok] / bound[ok]).max()))
        self.rows.append("replay,%d,,,,,,%s,,\n" % (self.steps, real(worst * REPLAY_ULPS)))
        self.events.append(("optimizer_step", self.steps, -1))
        self.steps += 1
        for b in self.since_step:
            self.backwards[b][2] = None  # fitted; only G_t is kept
        self.since_step = []

    # ---- output

    def close(self):
        """Recomputes what is pending, restores the optimizer and writes the
        trace (meta.csv, events.csv, values.csv, contract.csv)."""
        if self.closed:
            return
        self.closed = True
        self._recompute_pending()
        for h in self._hooks:
            h.remove()
        for attr in ("step", "zero_grad"):
            self.optimizer.__dict__.pop(attr, None)
        rows = []
        for j, m in enumerate(self.micro):
            cal = m[7] if len(m) > 7 else float("nan")
            rows.append("micro,%d,,%d,%d,%d,%d,,,%s\n" % (j, m[0], m[1], m[2], m[3], real(cal)))
        for b, rec in enumerate(self.backwards):
            w, resid = rec[3] if len(rec) > 3 else (float("nan"), float("nan"))
            rows.append("backward,%d,%d,,%d,,,%s,%s,\n" % (b, rec[0], rec[1], real(w), real(resid)))
        for e, (n, bs) in enumerate(self.epochs):
            rows.append("epoch,%d,,,,%d,%d,,,\n" % (e, n, bs))
        rows += self.rows
        dtype = self.params[0].dtype
        precision = {torch.float32: "float32", torch.float64: "float64"}.get(dtype, str(dtype))
        meta = [("schema", TRACE_SCHEMA), ("scenario", "contract"),
                ("scenario_digest", "contract"), ("engine", "pytorch"),
                ("precision", precision),
                ("tool_version", "accumcheck_torch-%s torch-%s" % (VERSION, torch.__version__)),
                ("tier", "contract"), ("accumulation", str(self.K)),
                ("items", self.items_kind), ("parameters", str(self.n))]
        events = []
        for kind, step, micro in self.events:
            events.append("%s,0,%d,%d,%s,0,0,,,,\n" % (self.run, step, micro, kind))
        write_trace(self.out, meta, events, [], extra={"contract.csv": CONTRACT_HEADER + "\n" + "".join(rows)})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
