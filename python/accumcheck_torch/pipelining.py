"""accumcheck inside a torch.distributed.pipelining trainer (the contract
tier, gloo on CPU): one stage per rank, each stage's own trace.

    stage = PipelineStage(whole[lo:hi], rank, ranks, device)  # a slice of `whole`
    schedule = ScheduleGPipe(stage, n, loss_fn=..., scale_grads=False)
    recorder = ContractPipelineRecorder(stage, schedule, None, optimizer, summed_loss,
                                        samples, accumulation=n * K, out="trace/")
    for x, y in recorder.watch(loader): ...   # schedule.step(x) / step(target=y), unchanged
    recorder.close()                          # every rank; each writes trace/stage<i>
    accumcheck certify --contract --trace trace/stage<i>

ContractPipelineRecorder is ContractRecorder on the stage's module with a
rank's life (distributed._RankLife): see its docstring for what the
schedule hides and how it is seen.  Named after the PyTorch module it
records (torch.distributed.pipelining).
"""

import math
import sys

import torch
import torch.distributed as dist

from .recompute import _rng_states, _set_rng_states
from .contract import ContractRecorder, _tensors
from .distributed import _process_group, _RankLife
from .guard import _never_raises
from .outputs import _NotTheForward, _Output
from .trace import Refused, clear_rank_markers, stopped_by


class ContractPipelineRecorder(_RankLife, ContractRecorder):
    """The contract tier's recorder for one stage of a
    torch.distributed.pipelining trainer (PipelineStage with ScheduleGPipe
    or Schedule1F1B; gloo on CPU), one stage per rank.

    ContractPipelineRecorder(stage, schedule, whole, optimizer, loss_fn,
                             count_fn, accumulation, out="trace", **kw)
    `stage` the rank's PipelineStage, `schedule` its schedule (its
    n_microbatches), loss_fn/count_fn the summed loss and item count of a
    (micro-)batch on the WHOLE model, `accumulation` the micro-batches per
    optimizer step (n_microbatches x schedule steps per optimizer step).
    `whole` (the whole model the stage was cut from) is no longer used:
    accepted, any value, so scripts written for the recorder that kept a
    copy of it still run.  Every rank iterates rec.watch(loader) over the
    same batches (stage 0 feeds their inputs to the schedule, the last
    stage their targets).

    What the pipeline hides and how it is seen:
      - a stage holds only its parameters: each rank's trace judges its
        stage's parameters alone, written to out/stage<i> (certify each);
      - the schedule splits each drawn batch into n micro-batches
        (torch.tensor_split along dim 0, as the schedule does): each is a
        micro-batch j of the trace;
      - which micro-batch a forward or backward belongs to: the stage's
        forward_one_chunk(fwd_chunk_id) / backward_one_chunk(bwd_chunk_id)
        says it (GPipe runs every forward first, 1F1B interleaves);
      - the weights: read at the last stage, which holds the model's
        outputs, as ContractRecorder reads them (summed_loss given the
        stage's output for the micro-batch: s_j, each backward's w_b and
        residual at the outputs).  A stage's parameters reach the loss
        only through the activations it sends, so the gradient an earlier
        stage's backward adds for micro-batch j is the same w_b times g_j
        restricted to its parameters: close() sends every (w_b, residual)
        from the last stage to the others (one collective), each writing
        them for its own backward passes;
      - the premise checked: on every calibrate_every-th micro-batch the
        last stage takes g_j's coordinates by one more backward of s_j
        through its retained graph (ContractRecorder's calibration), and
        the gradient of that backward at its inputs travels to the stage
        before (with w_b; a point-to-point send beside the schedule's
        own, on a process group of the recorder's), which does the same
        on its graph: c_b must be w_b g_j on every stage's coordinates;
      - a stage's .grad divided by n after the schedule's backward passes
        (scale_grads=True) is no backward pass: the step fit sees the
        gradient it consumes as a rescaled sum of the backward passes.
    Where a weight cannot be read at the last stage's outputs (summed_loss
    does not call the model once on the micro-batch, or the premise
    fails: the loss reaches parameters by another path), the recorder
    keeps no copy of the model to recompute it: the trace says so and
    certify does not judge it.

    A rank's life as the DDP recorders' (_RankLife): its marker
    out/stage<i>/rank<r>.incomplete says how far it got until the stage's
    trace is written, so a stage that dies (or ends by an exception)
    leaves a folder certify refuses naming its rank; close() writes the
    stage's trace only once every stage reached close() (a barrier).
    Stages that disagree on the micro-batches are refused when the
    recorders are made (a collective), before any schedule step (without
    the recorder such a pipeline waits forever on its peer)."""

    def __init__(self, stage, schedule, whole, optimizer, loss_fn, count_fn, accumulation,
                 out="trace", quiet=None, **kw):
        import os
        self.rank, self.world = _process_group()
        self.stage, self.whole = stage, whole  # whole: no longer used
        self.last = bool(stage.is_last)
        self.n_micro = int(getattr(schedule, "_n_microbatches", 0) or 0)
        if self.n_micro < 1:
            raise Refused("schedule: no n_microbatches (a torch.distributed.pipelining schedule)")
        out = os.path.join(out, "stage%d" % stage.stage_index)
        caller = sys._getframe(1)
        # Every stage must split a batch alike (a collective: every rank
        # makes its recorder); each stage's rank, and the calibration
        # cadence every stage follows (the least any asked for).
        counts = [None] * self.world
        dist.all_gather_object(counts, (self.n_micro, int(accumulation)))
        if len(set(counts)) > 1:
            where = [None] * self.world
            file = caller.f_code.co_filename
            if not os.path.relpath(file).startswith(".."):
                file = os.path.relpath(file)  # as the user typed it, below the working folder
            dist.all_gather_object(where, (stage.stage_index, file, caller.f_lineno, out))
            raise Refused(
                "rank %d: the pipeline's stages disagree on the micro-batches: %s; every stage's "
                "schedule (n_microbatches) and recorder (accumulation) must take the same; "
                "no trace written" % (self.rank, "; ".join(
                    "rank %d (stage %d, the recorder made at %s:%d, its trace %s): "
                    "n_microbatches %d, accumulation %d" % ((r,) + w + c)
                    for r, (w, c) in enumerate(zip(where, counts)))))
        if int(accumulation) % self.n_micro:
            raise Refused("accumulation = %d micro-batches per optimizer step is not a multiple "
                          "of the schedule's n_microbatches = %d (stage %d)"
                          % (int(accumulation), self.n_micro, stage.stage_index))
        ranks = [None] * self.world
        dist.all_gather_object(ranks, (stage.stage_index, max(1, int(kw.get("calibrate_every")
                                                                      or 16))))
        of_stage = {i: r for r, (i, _) in enumerate(ranks)}
        self.next_rank = of_stage.get(stage.stage_index + 1)
        self.prev_rank = of_stage.get(stage.stage_index - 1)
        kw["calibrate_every"] = min(c for _, c in ranks)
        # The premise check's sends beside the schedule's own (new_group: a
        # collective, every rank makes its recorder).
        self.p2p = dist.new_group(backend="gloo")
        self.step_base, self.stepped = 0, False
        self.drawn = []  # (first micro-batch, data_ptrs of the batch's tensors) per drawn batch
        self.fwd_micro = None  # the micro-batch whose forward the stage runs
        self.cal = {}          # micro-batch -> (w from the last stage, g_j's coordinates)
        self.checked = 0       # calibrated micro-batches whose premise this stage checked
        self.sends = []        # the premise check's sends in flight (work, buffer)
        self.unread = []       # (micro-batch, why) the last stage read no weight for
        self.to_send = None    # (micro-batch, w_b, the gradients at the stage's inputs)
        super().__init__(stage.submod, optimizer, loss_fn, count_fn, accumulation, out=out,
                         quiet=(self.rank != 0) if quiet is None else quiet, **kw)
        orig_fwd, orig_bwd = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(fwd_chunk_id, *a, **k):
            self.fwd_micro = self.step_base + int(fwd_chunk_id)
            try:
                return orig_fwd(fwd_chunk_id, *a, **k)
            finally:
                self.fwd_micro = None

        def backward_one_chunk(bwd_chunk_id, *a, **k):
            # The premise check's messages go whatever becomes of the
            # recorder (abandoned, failed: nan), so no stage ever waits on
            # one that did not come.
            chunk = int(bwd_chunk_id)
            j = self.current = self.step_base + chunk
            talk = j % self.calibrate_every == 0
            if talk:
                outs, ins = _stage_tensors(stage, chunk, self.prev_rank is not None)
                if self.next_rank is not None:
                    got = torch.empty(1 + sum(t.numel() for t in outs), dtype=torch.float64)
                    dist.recv(got, self.next_rank, group=self.p2p)
                else:
                    got = None
                self.to_send = None
                self._premise_before(j, outs, ins, got)
            out = orig_bwd(bwd_chunk_id, *a, **k)
            if talk and self.prev_rank is not None:
                msg = self._premise_message(j, ins)
                if msg is None:
                    msg = torch.full((1 + sum(t.numel() for t in ins),), float("nan"),
                                     dtype=torch.float64)
                for work, _ in self.sends:
                    work.wait()
                self.sends = [(dist.isend(msg, self.prev_rank, group=self.p2p), msg)]
            return out
        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        orig_step = schedule.step

        def step(*a, **k):
            self._schedule_step(_tensors(a, k))
            return orig_step(*a, **k)
        schedule.step = step

        def restore():
            for name in ("forward_one_chunk", "backward_one_chunk"):
                stage.__dict__.pop(name, None)
            schedule.__dict__.pop("step", None)
        self._restore_stage = restore
        self.all_reduced = False
        self._live()

    def _all_reduced(self, tensors):
        """A torch.distributed.all_reduce of this stage's gradients (data
        parallelism beside the pipeline) is not modelled by this recorder:
        said, and certify does not judge the trace."""
        if self._is_grad(tensors) and not self.all_reduced:
            self.all_reduced = True
            self.unseen.append("stage %d (rank %d): its gradients were all-reduced (data "
                               "parallelism beside the pipeline), which the pipeline recorder "
                               "does not model" % (self.stage.stage_index, self.rank))

    def _new_epoch(self, loader):
        super()._new_epoch(loader)
        if self.epochs[-1][1] > 0:
            self.epochs[-1][1] //= self.n_micro

    def _drawn(self, batch):
        """A drawn batch is the schedule's n micro-batches (held by the
        last stage until their forward reads the weights; an earlier stage
        keeps their counts only)."""
        try:
            parts = _split(batch, self.n_micro)
        except Refused as e:
            self._refuse(e.message)  # the recorder ends: no trace at exit
        self.drawn.append((len(self.micro), {t.data_ptr() for t in _flat(batch)}))
        for part in parts:
            super()._drawn(part)
            if not self.last and self.micro:
                self.micro[-1][5] = None

    def _schedule_step(self, tensors):
        """schedule.step(x) or step(target=y): the drawn batch it runs
        (matched by a tensor's storage; a stage given none runs the batch
        after the last one stepped): its micro-batches' forwards run now,
        at this parameter version."""
        ptrs = {t.data_ptr() for t in tensors}
        hit = [base for base, mine in self.drawn if ptrs & mine]
        later = [base for base, _ in self.drawn if base > self.step_base or not self.stepped]
        if not hit and not later:
            self._refuse("stage %d: schedule.step() on a batch not drawn from recorder.watch(loader)"
                         % self.stage.stage_index)
        self.step_base = hit[-1] if hit else later[0]
        self.stepped = True
        for j in range(self.step_base, self.step_base + self.n_micro):
            self.micro[j][1] = self.steps
            self.micro[j][4] = torch.get_rng_state()

    @_never_raises
    def _forward_hook(self, module, args, kwargs):
        """The last stage's forward of micro-batch j (forward_one_chunk):
        its outputs are the model's, where the weights are read
        (_take_from_forward, on _forward_done).  An earlier stage's
        forward sees activations only: nothing to read there."""
        j, ts = self.fwd_micro, _tensors(args, kwargs)
        if not self.last or j is None or not ts or not torch.is_grad_enabled() \
                or j >= len(self.micro) or self.micro[j][5] is None:
            return
        self.forwarded[j] = True
        self.pending = (j, ts[0])

    def _stand_in(self, pending, output):
        return _StageOutput(self.model, self.micro[pending[0]][5], output)

    def _fit_from_outputs(self):
        """The last stage: ContractRecorder's reading at the outputs.  An
        earlier stage: no weight here (the last stage's, at close()).  On a
        calibrated micro-batch, the premise checked on this stage's
        coordinates (the last stage: by ContractRecorder; an earlier one:
        against g_j carried back to it, _premise_before).  Where it fails,
        the pass is fitted on those coordinates, as a recompute would fit
        it (a residual far above its bound: certify's weight fit fails),
        and said; the later micro-batches are read at the outputs still
        (no copy of the model to recompute them on)."""
        if self.last:
            o = self.outs.get(next(iter({f[0] for f in self.out_fired}), None)) or {}
            g, held, said = o.get("g"), self.no_take, len(self.notes)
            j, fit = super()._fit_from_outputs()
            if fit is None and g is not None and self.no_take and not held:
                self.no_take = False  # the premise failed
                fit = _fit(self.buf.m[self.pass_row], g)
                del self.notes[said:]
                self.notes.append(
                    "micro-batch %d: on the last stage (%d) the gradient of its backward is not "
                    "the outputs' gradient carried back (fitted on it: a residual of %.3g of its "
                    "norm): the loss reaches the parameters by another path; that pass is fitted "
                    "on g_j carried back" % (j, self.stage.stage_index, fit[1]))
            return j, fit
        self.out_fired = []
        j = self.current
        w, g = self.cal.pop(j, (None, None))
        if g is None:
            return j, None
        self.spare.append(g)
        c = self.buf.m[self.pass_row]
        gn = float(g.norm())
        if math.isnan(w) or w == 0 or gn == 0 or not bool(torch.isfinite(c).all()):
            return j, None
        lin = float(torch.dist(c, g * w)) / (abs(w) * gn)
        self.checked += 1
        if lin <= self._premise_bound():
            self.micro[j][7] = lin
            return j, None
        self.notes.append(
            "micro-batch %d: on stage %d the gradient of its backward is not the last stage's "
            "weight times the summed loss's gradient carried back to it (%.3g of its norm apart): "
            "something reaches this stage's parameters other than the activations it sends; "
            "that pass is fitted on g_j carried back" % (j, self.stage.stage_index, lin))
        return j, _fit(c, g)

    @_never_raises
    def _premise_before(self, j, outs, ins, got):
        """Before the schedule's backward of calibrated micro-batch j: the
        summed loss's gradient at this stage's outputs (the last stage:
        s_j; an earlier one: `got` from the next stage, after w_b) carried
        back through the stage's retained graph, to its parameters (g_j's
        coordinates, kept by the gradient hooks; nothing parameter-sized is
        made) and to its inputs (what the stage before receives)."""
        g, w = None, float("nan")
        if self.last:
            o = self.outs.get(j)
            s = None if o is None or o["s"] is None or len(o["s"]) != len(outs) else o["s"]
        else:
            w, at, s = float(got[0]), 1, []
            for t in outs:
                s.append(got[at:at + t.numel()].view(t.shape).to(t.dtype))
                at += t.numel()
            if math.isnan(w):
                s = None
            else:
                g = self.spare.pop() if self.spare else torch.empty(self.coords.d,
                                                                    dtype=torch.float64)
            self.cal[j] = (w, g)
        grads = [None] * len(ins)
        if s is not None and outs and (g is not None or ins):
            rng = _rng_states()  # a backward that draws (a checkpoint) draws nothing of yours
            self.taking = True
            if g is not None:
                self.sample_into = self.buf.views_of(g)
                self.sample_seen = [False] * len(self.params)
            try:
                got = torch.autograd.grad(outs, (self.params if g is not None else []) + ins,
                                          grad_outputs=s, retain_graph=True, allow_unused=True)
            finally:
                self.taking = False
                _set_rng_states(rng)
            if g is not None:
                for dst, seen in zip(self.sample_into, self.sample_seen):
                    if not seen:
                        dst.zero_()
                self.sample_into = None
            grads = list(got[len(got) - len(ins):])
        self.to_send = (j, w, grads)

    @_never_raises
    def _premise_message(self, j, ins):
        """After the backward of calibrated micro-batch j, what goes to the
        stage before: w_b (the last stage's, read at its outputs; nan
        where none) and the gradient at this stage's inputs, float64."""
        pending, self.to_send = self.to_send, None
        if pending is None or pending[0] != j:
            return None
        _, w, grads = pending
        if self.last:
            w = self.backwards[-1][3][0] if self.backwards and self.backwards[-1][0] == j \
                and self.backwards[-1][3] is not None else float("nan")
        msg = torch.zeros(1 + sum(t.numel() for t in ins), dtype=torch.float64)
        msg[0] = w
        at = 1
        for t, g in zip(ins, grads):
            if g is not None:
                msg[at:at + t.numel()] = g.detach().reshape(-1)
            at += t.numel()
        return msg

    def _recompute_pending(self):
        """No recompute (no copy of the model): each micro-batch's batch is
        released after its backward; a pass the last stage could not read a
        weight for is said (certify does not judge the trace)."""
        for b in self.open_passes:
            j, fit = self.backwards[b][0], self.backwards[b][3]
            if self.last and fit is None:
                self.unread.append((j, ("summed_loss does not call the model once on the "
                                        "micro-batch's tensors, or the loss reaches the parameters "
                                        "by another path")))
            self.micro[j][5], self.micro[j][6] = None, True
            self.outs.pop(j, None)
        self.open_passes = []

    def _share_fits(self):
        """Every backward pass's (w_b, residual) and every micro-batch's
        calibration from the last stage to the others (one collective, in
        the same order on every rank); an earlier stage's own calibration,
        where it checked the premise, stands."""
        for work, _ in self.sends:
            work.wait()
        self.sends = []
        mine = None
        if self.last:
            fits = {}
            for b in self.backwards:
                fits.setdefault(b[0], []).append(b[3])
            mine = (fits, {j: m[7] for j, m in enumerate(self.micro) if not math.isnan(m[7])},
                    self.unread)
        every = [None] * self.world
        dist.all_gather_object(every, mine)
        fits, cal, unread = next(e for e in every if e is not None)
        if not self.last:
            taken = {}
            for b in self.backwards:
                k = taken[b[0]] = taken.get(b[0], -1) + 1
                f = fits.get(b[0], [])
                if b[3] is None:  # else fitted here (the premise failed: _fit_from_outputs)
                    b[3] = f[k] if k < len(f) else None
                if b[3] is None and not unread:
                    self.unread.append((b[0], ("no backward pass of it on the last stage (a "
                                               "backward the schedule did not run)")))
            for j, c in cal.items():
                if j < len(self.micro) and math.isnan(self.micro[j][7]):
                    self.micro[j][7] = c
            if self.backwards and not self.checked and not unread:
                self.notes.append("stage %d: no calibrated micro-batch's premise could be checked "
                                  "here (no gradient carried back to its outputs): its weights "
                                  "are the last stage's, unchecked" % self.stage.stage_index)
        if unread or self.unread:
            first = (self.unread or unread)[0]
            self.unseen.append(
                "stage %d: the weights of %d micro-batch(es) could not be read at the last "
                "stage's outputs (the first, micro-batch %d: %s); the pipeline recorder keeps no "
                "copy of the model to recompute them" % (
                    self.stage.stage_index, len({j for j, _ in unread + self.unread}), first[0],
                    first[1]))

    def close(self):
        """The stage's wrappers removed and the fits shared (every stage at
        once), then the trace written.  A recorder that ends alone
        (abandoned: a failure of its own, a refusal) keeps its wrappers,
        which go on sending and receiving the premise check's messages
        (nan: nothing to check), so the other stages never wait on it."""
        if not self.closed and not self.abandoned:
            if stopped_by():
                self._abandon(stopped_by())
                return
            self._restore_stage()
            self._recompute_pending()
            self._together(self._share_fits)
        super().close()

    def _write(self, meta, events, rows):
        """The stage's own trace, once every stage reached close(); then
        its marker goes."""
        def write():
            dist.barrier()
            super(ContractPipelineRecorder, self)._write(meta, events, rows)
            clear_rank_markers(self.out, self.rank)
        self._together(write)


def _fit(c, g):
    """(w, relative residual) of c as w * g (capture.py's recompute fit)."""
    gg = float(g.dot(g))
    w = float(c.dot(g)) / gg if gg > 0 else 0.0
    wn = abs(w) * gg ** 0.5
    if wn > 0:
        return w, float(torch.dist(c, g * w)) / wn
    return w, 0.0 if float(c.norm()) == 0 else float("inf")


class _StageOutput(_Output):
    """The last stage's output standing in for the whole model in
    summed_loss(model, batch): returned once, for a call with any of the
    micro-batch's tensors (the model's input, wherever the loss takes it
    from the batch)."""

    def __init__(self, model, batch, out):
        super().__init__(model, None, out)
        self._ids = {id(t) for t in _flat(batch)}

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls > 1 or not any(id(t) in self._ids for t in _tensors(a, k)):
            raise _NotTheForward()
        return self._out


def _stage_tensors(stage, chunk, inputs):
    """The stage's outputs for the chunk that need a gradient, and its
    inputs that take one (none for the first stage: `inputs` False)."""
    outputs, values = stage.fwd_cache[chunk]
    return ([t for t in _flat(outputs) if t.requires_grad],
            [t for t in values if torch.is_tensor(t) and t.requires_grad] if inputs else [])


def _flat(output):
    """The tensors of an output or a batch: a tensor, a list, tuple or dict
    of them, nested."""
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for o in output for t in _flat(o)]
    return []



def _split(batch, n):
    """The batch as the schedule splits it: n chunks along dim 0."""
    if torch.is_tensor(batch):
        return list(torch.tensor_split(batch, n, 0))
    if isinstance(batch, (list, tuple)):
        cols = [_split(b, n) for b in batch]
        return [type(batch)(c[i] for c in cols) for i in range(n)]
    if isinstance(batch, dict):
        cols = {k: _split(v, n) for k, v in batch.items()}
        return [{k: v[i] for k, v in cols.items()} for i in range(n)]
    raise Refused("a batch of %s: the recorder splits tensors, lists, tuples and dicts"
                  % type(batch).__name__)
