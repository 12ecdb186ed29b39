"""accumcheck inside a torch.distributed.pipelining trainer (the contract
tier, gloo on CPU): one stage per rank, each stage's own trace.

    stage = PipelineStage(whole[lo:hi], rank, ranks, device)  # a slice of `whole`
    schedule = ScheduleGPipe(stage, n, loss_fn=..., scale_grads=False)
    recorder = ContractPipelineRecorder(stage, schedule, whole, optimizer, summed_loss,
                                        samples, accumulation=n * K, out="trace/")
    for x, y in recorder.watch(loader): ...   # schedule.step(x) / step(target=y), unchanged
    recorder.close()                          # every rank; each writes trace/stage<i>
    accumcheck certify --contract --trace trace/stage<i>

ContractPipelineRecorder is ContractRecorder on the stage's module with a
rank's life (distributed._RankLife): see its docstring for what the
schedule hides and how it is seen.  Named after the PyTorch module it
records (torch.distributed.pipelining).
"""

import copy
import sys

import torch
import torch.distributed as dist

from .contract import ContractRecorder, _tensors
from .distributed import _process_group, _RankLife
from .trace import Refused, clear_rank_markers


class ContractPipelineRecorder(_RankLife, ContractRecorder):
    """The contract tier's recorder for one stage of a
    torch.distributed.pipelining trainer (PipelineStage with ScheduleGPipe
    or Schedule1F1B; gloo on CPU), one stage per rank.

    ContractPipelineRecorder(stage, schedule, whole, optimizer, loss_fn,
                             count_fn, accumulation, out="trace", **kw)
    `stage` the rank's PipelineStage, `schedule` its schedule (its
    n_microbatches), `whole` the whole model the stage's module was cut
    from (the stage's parameters must be the whole model's, e.g. a slice of
    an nn.Sequential), loss_fn/count_fn the summed loss and item count of a
    (micro-)batch on the WHOLE model, `accumulation` the micro-batches per
    optimizer step (n_microbatches x schedule steps per optimizer step).
    Every rank iterates rec.watch(loader) over the same batches (stage 0
    feeds their inputs to the schedule, the last stage their targets).

    What the pipeline hides and how it is seen:
      - a stage holds only its parameters: each rank's trace judges its
        stage's parameters alone, written to out/stage<i> (certify each);
      - the schedule splits each drawn batch into n micro-batches
        (torch.tensor_split along dim 0, as the schedule does): each is a
        micro-batch j of the trace;
      - which micro-batch a backward belongs to: the stage's
        backward_one_chunk(bwd_chunk_id) says it (GPipe runs every forward
        first, 1F1B interleaves);
      - g_j: recomputed on a copy of the whole model, its other stages'
        parameters gathered from their ranks after every step (a
        collective: every rank steps together), restricted to this
        stage's parameters;
      - a stage's .grad divided by n after the schedule's backward passes
        (scale_grads=True) is no backward pass: the step fit sees the
        gradient it consumes as a rescaled sum of the backward passes.
    Dropout inside a stage is not replayed (the RNG state at each
    micro-batch's forward is not captured): use a model without.

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
        self.stage, self.whole = stage, whole
        self.n_micro = int(getattr(schedule, "_n_microbatches", 0) or 0)
        if self.n_micro < 1:
            raise Refused("schedule: no n_microbatches (a torch.distributed.pipelining schedule)")
        out = os.path.join(out, "stage%d" % stage.stage_index)
        caller = sys._getframe(1)
        # Every stage must split a batch alike (a collective: every rank
        # makes its recorder).
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
        names = {id(p): n for n, p in whole.named_parameters()}
        mine = [p for p in stage.submod.parameters() if p.requires_grad]
        self.names = [names.get(id(p)) for p in mine]
        if None in self.names:
            raise Refused("stage %d: its module's parameters are not the whole model's (cut the "
                          "stage from `whole`, e.g. a slice of an nn.Sequential)" % stage.stage_index)
        self.step_base, self.stepped = 0, False
        self.drawn = []  # (first micro-batch, data_ptrs of the batch's tensors) per drawn batch
        super().__init__(stage.submod, optimizer, loss_fn, count_fn, accumulation, out=out,
                         quiet=(self.rank != 0) if quiet is None else quiet, **kw)
        for attr, copy_ in (("pref", self.mref), ("p64", self.m64)):
            named = dict(copy_.named_parameters())
            setattr(self, attr, [named[n] for n in self.names])
        self._gather_whole()
        orig = stage.backward_one_chunk

        def backward_one_chunk(bwd_chunk_id, *a, **k):
            self.current = self.step_base + int(bwd_chunk_id)
            return orig(bwd_chunk_id, *a, **k)
        stage.backward_one_chunk = backward_one_chunk
        orig_step = schedule.step

        def step(*a, **k):
            self._schedule_step(_tensors(a, k))
            return orig_step(*a, **k)
        schedule.step = step

        def restore():
            stage.__dict__.pop("backward_one_chunk", None)
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

    def _replica(self, model):
        return copy.deepcopy(self.whole)

    def _new_epoch(self, loader):
        super()._new_epoch(loader)
        if self.epochs[-1][1] > 0:
            self.epochs[-1][1] //= self.n_micro

    def _drawn(self, batch):
        """A drawn batch is the schedule's n micro-batches."""
        try:
            parts = _split(batch, self.n_micro)
        except Refused as e:
            self._refuse(e.message)  # the recorder ends: no trace at exit
        self.drawn.append((len(self.micro), {t.data_ptr() for t in _leaves(batch)}))
        for part in parts:
            super()._drawn(part)

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

    def _forward_hook(self, module, args, kwargs):
        return  # a stage's forward sees activations, not the drawn batch

    def _gather_whole(self):
        """Every stage's parameters into both copies (a collective): the
        stages' parameter names once (all_gather_object), then at every
        call one tensor all-gather of each stage's parameters flattened
        (float64, padded to the largest stage)."""
        if getattr(self, "stage_names", None) is None:
            self.stage_names = [None] * self.world
            dist.all_gather_object(self.stage_names, self.names)
            sizes = {n: p.numel() for n, p in self.whole.named_parameters()}
            self.stage_sizes = [sum(sizes[n] for n in names) for names in self.stage_names]
        with torch.no_grad():
            payload = torch.zeros(max(self.stage_sizes), dtype=torch.float64)
            at = 0
            for p in self.params:
                payload[at:at + p.numel()] = p.detach().reshape(-1)
                at += p.numel()
            every = [torch.empty_like(payload) for _ in range(self.world)]
            dist.distributed_c10d.all_gather(every, payload)
            for c in (self.mref, self.m64):
                named = dict(c.named_parameters())
                for names, flat in zip(self.stage_names, every):
                    at = 0
                    for n in names:
                        t = named[n]
                        t.copy_(flat[at:at + t.numel()].view(t.shape))
                        at += t.numel()

    def _after_step(self):
        super()._after_step()
        self._gather_whole()

    def close(self):
        if not self.closed:
            self._restore_stage()
        super().close()

    def _write(self, meta, events, rows):
        """The stage's own trace, once every stage reached close(); then
        its marker goes."""
        def write():
            dist.barrier()
            super(ContractPipelineRecorder, self)._write(meta, events, rows)
            clear_rank_markers(self.out, self.rank)
        self._together(write)


def _leaves(batch):
    if torch.is_tensor(batch):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [t for b in batch for t in _leaves(b)]
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
