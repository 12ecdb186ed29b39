"""What the contract recorder captures from your run (ContractRecorder's
capture part): the batches drawn, each forward, the gradient each backward
pass adds (at the sampled coordinates, sample.py), each micro-batch's
weight read at its forward's outputs, the recompute where that reading
does not hold, and the clip calls.  docs/tiers.md "What the recorder
keeps" says why this is enough."""

import copy
import functools

import torch
from accumcheck_trace.heap import heap_trim

from .batches import _compiled, _first, _on_device, _replaced, _same_values
from .fit import EVIDENCE_WEIGHT_REL, U32
from .guard import _never_raises
from .outputs import _NotTheForward, _Output, _out_tensors, _output_dots, _tensors
from .recompute import (_checkpoints_run_plain, _draw_once, _LossOf, _rng_states, _same_rng,
                        _set_rng_states, _to)
from .recorder import at_backward_end, eager, swap_clip
from .sample import sumsq64_as_clip


def compile_configs():
    """(torch._functorch.config, torch._inductor.config), imported at a
    recorder's first use, not with the package: importing
    torch._inductor.config imports torch._dynamo, about as much CPU again
    as torch itself (1.5 to 2 s), which a process that only loads a bundle
    or reads the version need not pay."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    return functorch_config, inductor_config


class Capture:
    """The hooks and recomputes of ContractRecorder (a mixin: the state
    lives on the recorder, made by its __init__)."""

    @_never_raises
    def _drawn(self, batch):
        self._ema_poll()
        self._recompute_pending()
        with torch.no_grad():
            items = int(self.count_fn(batch))
            unshifted = (None if self.unshifted_count_fn is None
                         else int(self.unshifted_count_fn(batch)))
        first = _first(batch)
        # The batch as drawn: a dict batch is kept as a shallow copy (the
        # same tensors), since a loop may take keys out of its own before
        # the forward (torchtune's recipes pop "labels") and the
        # recompute needs them all.
        if isinstance(batch, dict):
            batch = copy.copy(batch)
        self.micro.append([len(self.epochs) - 1, self.steps, items, int(first.shape[0]),
                           _rng_states(), batch, None, float("nan"), unshifted])
        self.first.append(first.data_ptr())
        self.forwarded.append(False)
        self.current = len(self.micro) - 1

    @_never_raises
    def _forward_hook(self, module, args, kwargs):
        """The forward of a drawn batch (matched by its first tensor's
        storage, passed positionally or by keyword; a loop that prefetches
        its window draws every batch before the first forward): the RNG
        state its dropout will draw from, and the parameter version it
        sees."""
        if not torch.is_grad_enabled() or self.recomputing:
            return
        heap_trim()
        self._ema_poll()
        for t in _tensors(args, kwargs):
            ptr = t.data_ptr()
            for j in range(len(self.micro) - 1, -1, -1):
                # A released batch's storage may hold another tensor now
                # (a cast copy of a later batch): only batches still held.
                if self.first[j] == ptr and not self.forwarded[j] and self.micro[j][5] is not None:
                    self.forwarded[j] = True
                    self.micro[j][4] = _rng_states()
                    self.micro[j][1] = self.steps
                    self.current = j
                    self.pending = (j, t)
                    return
        # No storage matched: the inputs are copies of a drawn batch (a
        # data-parallel wrapper or a device move copies them, as
        # Transformers' Trainer does under DDP; a bf16 model's loop casts
        # them): the oldest unforwarded micro-batch whose first tensor has
        # the same values (in the input's dtype).
        for j, done in enumerate(self.forwarded):
            if done or self.micro[j][5] is None:
                continue
            mine = _first(self.micro[j][5])
            for t in _tensors(args, kwargs):
                if t.shape == mine.shape and _same_values(t, mine):
                    self.forwarded[j] = True
                    self.micro[j][4] = _rng_states()
                    self.micro[j][1] = self.steps
                    self.current = j
                    if t.device != mine.device:
                        # Moved to the device by your loop (batch.to("cuda")):
                        # the batch is kept as the forward saw it (its input
                        # this very tensor, the rest moved alike), so g_j is
                        # taken from this forward and any recompute runs
                        # where the model is.
                        self.micro[j][5] = _on_device(self.micro[j][5], t)
                        self.pending = (j, t)
                    return

    @_never_raises
    def _forward_done(self, module, args, kwargs, output):
        """g_j from the forward your loop just ran, when summed_loss calls
        the model once on the same input: its backward only (retain_graph,
        so your backward still runs), at the same parameters, with the same
        dropout masks and BatchNorm statistics by construction.  Otherwise
        (or on any error) the micro-batch is recomputed on the copy."""
        if self.recomputing:
            return
        pending, self.pending = self.pending, None
        if pending is None or not any(t is pending[1] for t in _tensors(args, kwargs)):
            return
        j = pending[0]
        # The take's own backward through your graph may draw random numbers
        # (a checkpoint recomputing its segment without preserve_rng_state):
        # the generators are put back, so your run draws what it would have.
        rng = _rng_states()
        try:
            self._take_from_forward(j, pending, output)
        finally:
            _set_rng_states(rng)
            self.after_fwd = (j, rng)

    def _take_from_forward(self, j, pending, output):
        """The output-gradient path: g_j without a second backward.  The
        parameters reach your loss through this forward's outputs, so the
        gradient your backward adds, c_b = J^T u_b (u_b: your loss's
        gradient at the outputs, caught by a hook on them), is w_b * g_j
        exactly when u_b = w_b * s_j, s_j the summed loss's gradient at the
        same outputs (taken here through the loss alone, the size of the
        outputs): the weight and its residual are read at the outputs.
        Every calibrate_every-th micro-batch (the first included) checks
        the premise on the parameters: g_j's coordinates from one backward
        of s_j through your graph (retained; the hooks keep the coordinates
        and hand autograd an empty gradient, so nothing parameter-sized is
        made), against c_b; where it fails (the loss reaches parameters by
        another path than the outputs), every micro-batch from then on is
        recomputed (_recompute_pending)."""
        if j in self.outs or not torch.is_grad_enabled() or self.no_take:
            return
        self.taking = True
        try:
            outs = [t for t in _out_tensors(output) if t.requires_grad]
            view, leaves = self._loss_view(output, outs)
            loss = self.loss_fn(self._stand_in(pending, view), self.micro[j][5])
            s = torch.autograd.grad(loss, leaves, retain_graph=True, allow_unused=True) \
                if outs else []
            pairs = [(t, g.detach()) for t, g in zip(outs, s) if g is not None]
            if not pairs:
                raise _NotTheForward()
            self._premise_structure(loss, j)
            g = None
            if self._calibrates(j):
                self._rounded_once(pending, view, leaves, s, loss, j)
                g = self.spare.pop() if self.spare else torch.empty(self.coords.d,
                                                                    dtype=torch.float64)
                self.sample_into = self.buf.views_of(g)
                self.sample_seen = [False] * len(self.params)
                if self._calibrate(pairs):
                    for dst, seen in zip(self.sample_into, self.sample_seen):
                        if not seen:
                            dst.zero_()
                else:
                    self.spare.append(g)
                    g = None
        except Exception as e:  # noqa: BLE001 -- the recompute stands in
            self.sample_into = None
            if _compiled(output):
                # A recompute on the eager model is no stand-in for compiled
                # code (its rounding, and its dropout masks: inductor draws
                # its own random numbers).
                self.unseen.append(
                    "micro-batch %d: its forward ran under torch.compile and its gradient could not "
                    "be taken from that forward (%s); an eager recompute cannot stand in for it"
                    % (j, str(e).split(". ")[0]))
            elif not isinstance(e, _NotTheForward):
                # The same forward fails the same way: every micro-batch
                # recomputed, without trying each.
                self.no_take = True
            return
        finally:
            self.taking = False
            self.sample_into = None
        for t, sg in pairs:
            if t.dtype in (torch.bfloat16, torch.float16) and t.dtype != self.dtype:
                self.compute_dtype = t.dtype  # autocast: the model computes lower
        self.outs[j] = {"s": [sg for _, sg in pairs], "g": g}
        for k, (t, _) in enumerate(pairs):
            t.register_hook(self._out_hook(j, k))

    def _rounded_once(self, pending, view, leaves, s, loss, j):
        """Under bfloat16 autocast the outputs are bfloat16 while the loss
        computes in float32 (cross-entropy casts its input up): the weight
        read at the outputs, u_b.s_j / s_j.s_j, is then as exact as one
        rounding of each of u_b and s_j (error model
        contract_weight_read_ulps), not the backward's bf16 rounding.
        Checked here on the calibrated micro-batch: the summed loss taken
        again on float32 copies of the low-precision outputs, its float32
        gradient rounded to their dtype must be s_j bit for bit, and the
        loss itself float32.  Any difference (a loss computing in bfloat16)
        clears read_once for the run: certify then reads the weights to the
        fit bound, as before."""
        lowp = (torch.bfloat16, torch.float16)
        if not self.read_once or not any(t.dtype in lowp for t in leaves):
            return
        self.read_checks += 1
        if any(t.dtype == torch.float16 for t in leaves):
            # float16's range ends at 2^-14: below it a rounding is no
            # longer relative (underflow_fp16), so no such claim.
            self.read_once = False
            return
        try:
            up = {id(t): t.detach().float().requires_grad_() for t in leaves if t.dtype in lowp}
            loss32 = self.loss_fn(self._stand_in(pending, _replaced(view, up)), self.micro[j][5])
            s32 = torch.autograd.grad(loss32, list(up.values()), allow_unused=True)
            by = dict(zip(up, s32))
            ok = loss.dtype in (torch.float32, torch.float64) and all(
                (by[id(t)] is not None and g is not None and torch.equal(by[id(t)].to(t.dtype), g))
                if id(t) in by else True for t, g in zip(leaves, s))
        except Exception:  # noqa: BLE001 -- no claim where the check cannot run
            ok = False
        self.read_once = self.read_once and ok

    def _loss_view(self, output, outs):
        """What summed_loss reads as the forward's output, and the tensors
        s_j is taken at: the output itself (a sharding recorder: detached
        copies, so no hook of its wrapper fires in that backward)."""
        return output, outs

    def _premise_structure(self, loss, j):
        """A check of the premise on the loss's graph (a sharding recorder's)."""

    def _calibrates(self, j):
        """Whether micro-batch j's take calibrates (every calibrate_every-th;
        a sharding recorder: the forward its ranks agree on, fsdp.py)."""
        return j % self.calibrate_every == 0

    def _calibrate(self, pairs):
        """The premise check's backward of s_j through your graph to the
        parameters (their hooks keep the coordinates); False: not run."""
        torch.autograd.grad([t for t, _ in pairs], self.params,
                            grad_outputs=[sg for _, sg in pairs], retain_graph=True,
                            allow_unused=True)
        return True

    def _stand_in(self, pending, output):
        """What summed_loss is given as the model: the forward's output for
        its input (a pipeline's last stage: for the micro-batch's)."""
        return _Output(self.model, pending[1], output)

    def _out_hook(self, j, k):
        @_never_raises
        def hook(self, u):
            o = self.outs.get(j)
            if o is None or self.taking:
                return None
            if o["s"] is None:
                # A second backward through this forward (retain_graph): its
                # s_j is gone; the pass is recomputed (_fit_from_outputs).
                self.out_fired.append((j, k, None, None, None))
                return None
            s = o["s"][k]
            us, ss, rr = _output_dots(s, u)
            self.out_fired.append((j, k, us, ss, rr))
            return None
        return functools.partial(hook, self)

    def _patch_model(self):
        rec = self
        self._hooks += [p.register_hook(self._grad_hook(i)) for i, p in enumerate(self.params)]
        # A torch.compile'd model, compiled while this recorder lives: its
        # backward keeps its buffers (AOTAutograd donates them by default,
        # and then refuses the retain_graph that takes g_j from your
        # forward), and inductor draws dropout's random numbers as eager
        # PyTorch does (fallback_random), so the float64 recompute replays
        # the same masks from the captured RNG state.
        functorch_config, inductor_config = compile_configs()
        self._compile_config = (functorch_config.donated_buffer, inductor_config.fallback_random)
        functorch_config.donated_buffer = False
        inductor_config.fallback_random = True
        # Under torch.compile the module hooks run eagerly (a graph break
        # around each), never traced into the graph: what they record (the
        # input, the RNG state, the output) is the forward's own.
        self._hooks.append(self.model.register_forward_pre_hook(eager(self._forward_hook),
                                                                with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(eager(self._forward_done),
                                                            with_kwargs=True))
        # The precision the forward computes in, seen inside it (a wrapper
        # may enter autocast inside the model's forward and cast the outputs
        # back to float32, as Accelerate's mixed precision does): autocast's
        # state at the first module that holds parameters.
        inner = next((m for m in self.model.modules()
                      if m is not self.model and any(True for _ in m.parameters(recurse=False))),
                     None)
        if inner is not None:
            self._hooks.append(inner.register_forward_pre_hook(eager(self._autocast_probe)))
        # clip_grad_norm_, also when imported by name before the recorder
        # existed: its code swapped for a call to the recorder (as the
        # oracle tier's Recorder does; one recorder at a time).
        def make_clip(saved):
            def clip(parameters, max_norm, *a, **k):
                if torch.is_tensor(parameters):
                    parameters = [parameters]
                parameters = list(parameters)
                rec.clip_foreach = k.get("foreach", a[2] if len(a) > 2 else None)
                norm, shard = rec._clip_norms(parameters)
                off = rec._off_bf16(parameters)
                total = saved(parameters, max_norm, *a, **k)
                rec._clipped(min(1.0, float(max_norm) / (float(total) + 1e-6)), norm, shard,
                             float(max_norm), off)
                return total
            return clip
        self._restore_clip = swap_clip(make_clip)

    def _autocast_probe(self, module, args):
        """Autocast's dtype, where the forward runs under it at a precision
        below the parameters': the precision the weights are read in."""
        if self.recomputing or self.compute_dtype != self.dtype:
            return
        for device in {p.device.type for p in module.parameters(recurse=False)}:
            if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
                dt = torch.get_autocast_dtype(device)
                if dt in (torch.bfloat16, torch.float16) and dt != self.dtype:
                    self.compute_dtype = dt

    def _clip_norms(self, parameters):
        """The norm of the gradient a clip sees (whole: a shard gathered)
        and of this rank's shard of it (None: not sharded): each tensor's
        norm taken as clip_grad_norm_ takes it (sample.sumsq64_as_clip), their
        combination in float64, so the clip's own float32 total differs
        from it only by that combination's rounding over as many terms as
        tensors (meta.csv clip_norm_terms; a gradient below float32 keeps
        the bound over every element)."""
        grads = [self._full(p.grad) for p in parameters if p.grad is not None]
        self.clip_terms = max(self.clip_terms, len(grads))
        self.clip_lowp = self.clip_lowp or any(
            g.dtype in (torch.bfloat16, torch.float16) for g in grads)
        with torch.no_grad():
            return sum(sumsq64_as_clip(grads, getattr(self, "clip_foreach", None))) ** 0.5, None

    def _off_bf16(self, parameters):
        """How many elements of the gradient a clip sees bfloat16 cannot
        hold, on the recorder's coordinates of each recorded parameter (0: a
        bf16 gradient buffer before the clip, whose factor then makes
        float32 numbers of it; certify's low-precision-grad-buffer)."""
        index = {id(p): i for i, p in enumerate(self.params)}
        counts = []
        with torch.no_grad():
            for p in parameters:
                if p.grad is None:
                    continue
                i = index.get(id(p))
                g = p.grad.detach()
                if self._sampled and i is not None:
                    g = self.buf.take(i, g)
                counts.append((g.to(torch.bfloat16).to(g.dtype) != g).sum())
            # One transfer to the host (on a GPU, one synchronisation).
            return int(torch.stack([c.to(counts[0].device) for c in counts]).sum()) \
                if counts else 0

    def _clipped(self, factor, norm, shard, max_norm, off_bf16=None):
        """A clip seen: the factor it applied, the norms of the gradient it
        saw (whole, and this rank's shard: None where not sharded), its
        max_norm (nan: a scaling seen on .grad, no clip function called)
        and the elements of that gradient bfloat16 cannot hold (None: not
        counted)."""
        self.clips.append([self.steps, factor, norm, max_norm, shard, off_bf16])
        self.events.append(("clip", self.steps, -1, None))

    def _grad_hook(self, i):
        @_never_raises
        def hook(self, grad):
            if self.taking:
                if self.sample_into is None:
                    return None
                # The calibration's backward of s_j (_take_from_forward):
                # the coordinates kept, an empty gradient handed on.
                dst = self.sample_into[i]
                if self.sample_seen[i]:
                    dst.add_(self.buf.take(i, grad))
                else:
                    dst.copy_(self.buf.take(i, grad))
                    self.sample_seen[i] = True
                return grad.new_zeros(()).expand(grad.shape)
            if not self.in_backward:
                self.in_backward = True
                self.pass_row = 1 + len(self.since_step)
                self.pass_views = self.buf.begin_pass(self.pass_row)
                self.seen = [False] * len(self.params)
                at_backward_end(self._end_backward)
            g = self.buf.take(i, grad)
            dst = self.buf.dest(i, g.device, self.pass_views)
            if self.seen[i]:
                dst.add_(g)
            else:
                dst.copy_(g)  # a copy: .grad may take the incoming tensor
                self.seen[i] = True
            return None
        return functools.partial(hook, self)

    @_never_raises
    def _end_backward(self):
        self.in_backward = False
        self.buf.end_pass(self.pass_row)  # the coordinates gathered on a device, to the host
        if not self.micro:
            self._refuse("a backward pass before any batch was drawn: iterate over "
                         "rec.watch(loader), or call rec.mark(batch) before each forward")
        if self.after_fwd is not None and self.after_fwd[0] == self.current:
            # The CPU RNG moved between the forward's end and its backward's
            # end: the backward drew random numbers (a recomputation that
            # does not replay the forward's, e.g. torch.utils.checkpoint
            # with preserve_rng_state=False around dropout).
            if not _same_rng(_rng_states(), self.after_fwd[1]):
                self.rng_in_backward.append(self.current)
            self.after_fwd = None
        self._ema_poll()
        micro, fit = self._fit_from_outputs()
        self.since_step.append(len(self.backwards))
        self.backwards.append([micro, self.steps, self.pass_row, fit])
        self.open_passes.append(len(self.backwards) - 1)
        self.events.append(("forward_backward", self.steps, self.current, None))
        self._progress(write=False)

    def _fit_from_outputs(self):
        """The micro-batch of the backward pass that just ended and its
        weight fit (w_b, relative residual) read at the outputs of its
        forward (_take_from_forward), or None: recomputed later."""
        fired, self.out_fired = self.out_fired, []
        js = {f[0] for f in fired}
        if len(js) != 1:
            return self.current, None  # no output path, or two forwards in one pass
        j = js.pop()
        o = self.outs[j]
        if any(f[2] is None for f in fired):
            return j, None
        # The outputs' gradients are as large as the logits: held from the
        # forward to its first backward pass only.
        o["s"] = None
        us = sum(f[2] for f in fired)
        ss = sum(f[3] for f in fired)
        if ss <= 0:
            return j, None
        w = us / ss
        # |u - w s|^2 over the outputs: each output's own residual plus its
        # weight's distance from the common one (u - w s = (u - w_k s) +
        # (w_k - w) s, the first orthogonal to s).
        rr = sum(f[4] + (f[2] / f[3] - w) ** 2 * f[3] for f in fired if f[3] > 0)
        wn = abs(w) * ss ** 0.5
        resid = rr ** 0.5 / wn if wn > 0 else (0.0 if rr == 0 else float("inf"))
        g, o["g"] = o["g"], None
        if g is not None:
            self.spare.append(g)
            c = self.buf.m[self.pass_row]
            if not bool(torch.isfinite(c).all()):
                # An overflowed pass (a window the loss scaler skips): no
                # premise to check on it.
                return j, (w, resid)
            gn = float(g.norm())
            lin = float(torch.dist(c, g * w)) / (abs(w) * gn) if w != 0 and gn > 0 else 0.0
            if lin > self._premise_bound():
                # The loss reaches the parameters by another path than the
                # outputs (a penalty on the weights, a second forward):
                # recomputed from here on (the batch is still held).
                self.no_take = True
                if j not in self.rng_in_backward:  # else the randomness note says why
                    self.notes.append(
                        "micro-batch %d: the gradient of its backward is not the outputs' "
                        "gradient carried back (%.3g of its norm apart): the loss reaches the "
                        "parameters by another path; every micro-batch from it on is recomputed"
                        % (j, lin))
                return j, None
            if j not in self.rng_in_backward:
                self.micro[j][7] = lin
        return j, (w, resid)

    def _premise_bound(self):
        """How far g_j's coordinates from the outputs' gradient may stray
        from c_b / w_b before the loss is taken to reach the parameters by
        another path: the precision at which certify reads a weight
        (evidence_weight_rel), or 16 units of the precision the model
        computes in where that is coarser (autocast in bfloat16)."""
        unit = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}.get(self.compute_dtype, U32)
        return max(EVIDENCE_WEIGHT_REL, 16 * unit)

    def _grad_of(self, model, params, batch, dtype, dst):
        """The copy's gradient by backward() into its own .grad (a copy's
        .grad is nobody else's), its activation checkpoints run plainly
        (_checkpoints_run_plain)."""
        for p in params:
            p.grad = None
        # Grad mode on: the recompute may run inside a step that an
        # optimizer wrapper runs under no_grad (DeepSpeed's bf16 optimizer).
        with torch.enable_grad(), _checkpoints_run_plain():
            loss = self.loss_fn(model, _to(batch, dtype))
            # One draw between the forward and its backward (_draw_once).
            _draw_once()
            loss.backward()
        self.buf.fill(dst, [p.grad for p in params])
        for p in params:
            p.grad = None
        return dst

    def _recompute_on(self, batch, dtype, dst):
        """g_j recomputed on the model itself in `dtype`
        (_LossOf under functional_call: your parameters' storage, detached,
        cast where dtype differs; copies of the buffers), by autograd.grad of the summed
        loss, so no .grad of yours and no BatchNorm statistic moves.  A
        recorder class with copies of its own (self.mref) runs on them."""
        if self.mref is not None:
            copy_, params = (self.mref, self.pref) if dtype == self.dtype else (self.m64, self.p64)
            return self._grad_of(copy_, params, batch, dtype, dst)
        if self.loss_of is None:
            self.loss_of = _LossOf(self.model, self.loss_fn)
        tensors, mine = {}, []
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                t = p.detach()
                if t.is_floating_point() and t.dtype != dtype:
                    t = t.to(dtype)
                tensors["model." + name] = t.requires_grad_(p.requires_grad)
                if p.requires_grad:
                    mine.append(tensors["model." + name])
            for name, b in self.model.named_buffers():
                tensors["model." + name] = b.detach().to(dtype) if b.is_floating_point() and \
                    b.dtype != dtype else b.detach().clone()
        self.recomputing = self.taking = True
        try:
            with torch.enable_grad(), _checkpoints_run_plain():
                loss = torch.func.functional_call(self.loss_of, tensors, (_to(batch, dtype),))
                # One draw between the forward and its backward (_draw_once).
                _draw_once()
                grads = torch.autograd.grad(loss, mine, allow_unused=True)
        finally:
            self.recomputing = self.taking = False
        return self.buf.fill(dst, grads)

    def _recompute_pending(self):
        """g_j (in the model's precision; float64 on the calibration sample)
        for every micro-batch with a backward pass not yet fitted (its
        gradient not read at its forward's outputs), at the current
        parameters (those of its forward: called before any step), then
        the weight fit of each of those backward passes.  Batches whose
        passes are all fitted are released."""
        # Only the passes since the last call (open_passes): a scan of every
        # pass of the run at every draw would grow with the run's length.
        passes = [self.backwards[b] for b in self.open_passes
                  if self.micro[self.backwards[b][0]][5] is not None]
        self.open_passes = []
        unfitted = sorted({b[0] for b in passes if b[3] is None})
        for b in passes:
            if b[3] is not None and self.micro[b[0]][5] is not None and b[0] not in unfitted:
                self.micro[b[0]][5], self.micro[b[0]][6] = None, True
                self.outs.pop(b[0], None)
        if not unfitted:
            return
        # A micro-batch whose backward drew random numbers has no one
        # gradient to calibrate against (the note says why).
        calibrate = [j for j in unfitted
                     if j % self.calibrate_every == 0 and j not in self.rng_in_backward]
        if self.mref is not None:
            with torch.no_grad():
                for dst, src in zip(self.pref, self._source()):
                    dst.copy_(src)
                if calibrate:
                    for dst, src in zip(self.p64, self._source()):
                        dst.copy_(src)
        keep = _rng_states()
        g, g64, tmp = self.vec[1], self.vec[2], self.vec[3]
        for j in unfitted:
            m = self.micro[j]
            if m[1] != self.steps:
                self._refuse("micro-batch %d: an optimizer step between its forward and its "
                             "recompute" % j)
            _set_rng_states(m[4])
            self._recompute_on(m[5], self.dtype, g)
            if j in calibrate:
                _set_rng_states(m[4])
                try:
                    self._recompute_on(m[5], torch.float64, g64)
                except Exception as e:  # noqa: BLE001 -- a model that cannot run in float64
                    self.notes.append("micro-batch %d: the float64 calibration could not run "
                                      "(%s): the run's other calibrations stand for it"
                                      % (j, str(e).split("\n")[0][:200]))
                else:
                    n64 = float(g64.norm())
                    m[7] = float(torch.dist(g, g64)) / n64 if n64 > 0 else 0.0
            m[5], m[6] = None, True  # the batch is no longer needed
            gg = float(g.dot(g))
            for rec in passes:
                if rec[0] != j or rec[3] is not None:
                    continue
                c = self.buf.m[rec[2]]
                w = float(c.dot(g)) / gg if gg > 0 else 0.0
                wn = abs(w) * gg ** 0.5
                if wn > 0:
                    torch.mul(g, w, out=tmp)
                    resid = float(torch.dist(c, tmp)) / wn
                else:
                    resid = 0.0 if float(c.norm()) == 0 else float("inf")
                rec[3] = (w, resid)
                self.fits_recomputed += 1
        _set_rng_states(keep)
