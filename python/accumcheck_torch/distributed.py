"""accumcheck inside torch.distributed: DDP trainers (gloo on CPU).

    dist.init_process_group("gloo")          # torchrun, or mp.spawn
    bundle = load_bundle("bundle/")           # this rank's view (its shards)
    model = DDP(MyNet())  ...                 # bundle.load_initial() before wrapping
    recorder = DistributedRecorder(bundle, model, optimizer, scheduler, out="trace/")
    ... your DDP loop, unchanged (no_sync, DistributedSampler, ...) ...
    recorder.close()                          # every rank; rank 0 writes trace/

Each rank records its own part with the one Recorder (recorder.py): its
calls, the gradient its optimizer consumes and its parameters after every
step.  DDP's gradient all-reduce is recorded without touching DDP's
arithmetic (no comm hook): DDP decides at each forward whether the coming
backward synchronizes (`require_backward_grad_sync`, which `no_sync()`
clears), and the recorder reads that flag in a forward pre-hook on the DDP
module; the backward it belongs to is then followed by one `all_reduce`
event.  Autograd runs DDP's finalize (which writes the averaged gradient
into .grad) as a callback queued during the backward, so the recorder's
end-of-backward callback is queued from a callback, after it: the
gradient it keeps is the one DDP left.

A sharded (ZeRO-style) clip -- each rank clips its chunk of the gradient,
then torch.distributed.all_gather brings every rank the clipped chunks --
changes the gradient after clip_grad_norm_; the recorder sees the
all_gather (torch.distributed.all_gather is wrapped while it records),
notes it and lets certify judge the values (ddp-clip-local-norm).

close() gathers every rank's part on rank 0 (torch.distributed's
gather_object, over the trainer's own process group) and rank 0 writes ONE
trace with the `rank` column (merge_parts): every rank's events, the
all-reduce once as the collective (rank -1), rank 0's gradient and every
rank's parameters.  `accumcheck certify` then judges rank 0's values,
checks that every rank holds rank 0's parameters after each step and
counts the all-reduces in the call pattern.

The contract tier (any nn.Module, no bundle) has its own rank recorder,
ContractDistributedRecorder: each rank measures what ContractRecorder
measures on its own shard (its micro-batches' g_j recomputed, each
backward's local gradient fitted as w_b g_j), and at each optimizer step
the ranks all-gather their backward passes since the previous step, so
each rank fits the gradient its optimizer consumes (DDP's average at the
synchronising micro-step, the local sum under no_sync) over EVERY rank's
backward passes; close() merges the parts on rank 0 into one contract
trace with the rank column (merge_contract_parts; events through
merge_parts).  `accumcheck certify --contract` then judges each rank's
fitted weights against the coefficient engine run with R ranks.

The recorders built on these live beside this module, which knows none of
them: FSDP's (ContractFSDPRecorder, ContractFSDP1Recorder) in fsdp.py, a
pipeline stage's (ContractPipelineRecorder) in pipelining.py, DeepSpeed's
in deepspeed.py.  The FSDP recorders were published as
accumcheck_torch.distributed.ContractFSDPRecorder (docs/memory-systems.md
until the split): that name still imports them (a lazy re-export, the
module's __getattr__); import them from accumcheck_torch.fsdp.

This module holds the two DDP rank recorders; what every rank recorder
shares lives beside it: rank_life.py (the process group, the wrapped
torch.distributed functions, how a rank recorder ends, close()'s gather),
merge_ranks.py (the ranks' parts merged into one trace) and launch.py
(run_ranks, launch, exit_rank: starting ranks and ending their
processes).  Every name published here before that split still imports
from here.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .contract import ContractRecorder
from .launch import exit_rank, launch, run_ranks  # noqa: F401 -- published here
from .merge_ranks import merge_contract_parts, merge_parts
from .rank_life import _process_group, _RankLife
from .recorder import Recorder
from .torch_hooks import at_backward_end, eager
from .trace import Refused, write_trace


def _will_sync(module):
    """DDP prepares the reducer (the coming backward all-reduces) when
    gradients are enabled and no_sync() is not active."""
    return torch.is_grad_enabled() and module.require_backward_grad_sync


class DistributedRecorder(_RankLife, Recorder):
    """A Recorder for one rank of a torch.distributed trainer.

    DistributedRecorder(bundle, model, optimizer, scheduler=None,
                        out="trace", run="trainer", names=None, quiet=None)
    `model` is the DistributedDataParallel module (or the plain module of a
    trainer that synchronizes by hand: its all-reduces are then unseen);
    `bundle` is this rank's view (load_bundle in this rank's process);
    quiet defaults to True on every rank but 0."""

    def __init__(self, bundle, model, optimizer, scheduler=None, out="trace",
                 run="trainer", names=None, quiet=None):
        self.rank, self.world = _process_group()
        if self.world != bundle.ranks:
            raise Refused("the process group has %d ranks, the scenario %s has ranks = %d"
                          % (self.world, bundle.scenario, bundle.ranks))
        if bundle.rank != self.rank:
            raise Refused("rank %d records with a bundle loaded for rank %d "
                          "(load_bundle(folder) in each rank's process)"
                          % (self.rank, bundle.rank))
        self.ddp = model if isinstance(model, DistributedDataParallel) else None
        self.sync_pending = False  # a forward since the last backward will sync
        self.all_reduces = 0
        self.hand_reduces = 0      # gradient all-reduces the trainer made itself
        self._reduced = False      # one since the last backward (a sweep is one)
        # The rank's own samples per epoch (its shards), for the epoch count.
        self.shards = [{s for w in ep for m in w for s in m} for ep in bundle.order]
        self.shard_sizes = [sum(len(m) for w in ep for m in w) for ep in bundle.order]
        self._drawn = 0        # samples this rank drew in the epoch (repeats too)
        self._in_plan = True   # every one of them from the scenario's shard
        # Each rank's values travel to rank 0 as values.csv rows, which
        # merge_parts tags with the rank (values.bin is single-rank).
        super().__init__(bundle, model, optimizer, scheduler, out=out, run=run,
                         names=names, quiet=(self.rank != 0) if quiet is None else quiet,
                         values="csv")
        # torch.distributed.all_gather, seen: a sharded (ZeRO-style) clip
        # gathers the chunks other ranks clipped into the gradient.
        self.gathered = False
        self._all_gather = dist.all_gather

        def all_gather(*a, **k):
            self.gathered = True
            return self._all_gather(*a, **k)
        dist.all_gather = all_gather
        if self.ddp is not None:
            self._hooks.append(self.ddp.register_forward_pre_hook(eager(self._ddp_forward)))
        self._live()

    def close(self):
        if not self.closed and self.ddp is None and not self.hand_reduces:
            self.unseen.append("rank %d: the model is not a DistributedDataParallel module and "
                               "no torch.distributed.all_reduce of its gradients was seen: its "
                               "gradient all-reduces are not seen" % self.rank)
        super().close()

    def _all_reduced(self, tensors):
        """A torch.distributed.all_reduce of the parameters' gradients (the
        trainer's own, e.g. the tutorial's average_gradients): one
        all_reduce event per sweep over the parameters (the calls between
        two backward passes).  What the trainer does to the gradient after
        it (dividing by the world size, or not) is judged on the values:
        the gradient the step consumes is no longer compared with the one
        backward left."""
        if not self._is_grad(tensors):
            return
        if not self._reduced:
            self._reduced = True
            self.hand_reduces += 1
            self.all_reduces += 1
            self._event("all_reduce")
        self.snapshot = None

    def _unpatch(self):
        dist.all_gather = self._all_gather
        super()._unpatch()

    def _check_unseen_change(self, consumed, may_be_clip=True):
        """A gradient changed after the rank's clip by chunks gathered
        from the other ranks (torch.distributed.all_gather since the clip)
        is a sharded clip, not an unseen change: noted, and judged on the
        values."""
        if may_be_clip and self.gathered and self.events and self.events[-1][4] == "clip":
            self.gathered = False
            self.notes.append("step %d: the gradient changed after clip_grad_norm_ by chunks "
                              "gathered with torch.distributed.all_gather (a sharded clip)"
                              % self.steps)
            return
        super()._check_unseen_change(consumed, may_be_clip)

    def _ddp_forward(self, module, inputs):
        if _will_sync(module):
            self.sync_pending = True

    def _covered(self):
        """The epoch is covered when this rank drew its shard (all but
        fewer than b of it), not the scenario's every sample."""
        e = min(self.epoch, len(self.shards) - 1)
        return len(self.epoch_ids) >= len(self.shards[e]) - (self.bundle.micro_batch - 1)

    def _new_epoch(self, ids):
        """After the rank's shard is covered, the next epoch starts with a
        sample drawn again, or once the rank drew as many samples as its
        shard holds (a shuffling DistributedSampler draws its own shard of
        that size), or -- while the rank draws the scenario's shard -- with
        a sample outside it (a rank's next shard need not repeat any of its
        samples, and drop_last may leave it short)."""
        e = min(self.epoch, len(self.shards) - 1)
        new = self._covered() and (
            any(i in self.epoch_ids for i in ids) or self._drawn >= self.shard_sizes[e]
            or (self._in_plan and any(i not in self.shards[e] for i in ids)))
        if new:
            self._drawn, self._in_plan = 0, True
            e = min(self.epoch + 1, len(self.shards) - 1)
        self._drawn += len(ids)
        self._in_plan = self._in_plan and all(i in self.shards[e] for i in ids)
        return new

    def _grad_hook(self, grad):
        if not self.in_backward:
            self.in_backward = True
            self._begin_backward()
            engine = torch.autograd.Variable._execution_engine
            # Queued from a callback: it runs after DDP's finalize_backward.
            at_backward_end(lambda: engine.queue_callback(self._end_backward_synced))
        return None

    def _end_backward_synced(self):
        self._end_backward()
        self._reduced = False
        if self.sync_pending:
            self.sync_pending = False
            self.all_reduces += 1
            self._event("all_reduce")

    def _write(self, meta, events, values, extra):
        # The training state (state.csv: optimizer state, BatchNorm buffers)
        # is rank 0's: DDP keeps it identical on every rank.
        self._gather_write((self.rank, meta, events, values.rows), lambda parts: write_trace(
            self.out, *merge_parts(parts), extra=extra, ranks=True))


class ContractDistributedRecorder(_RankLife, ContractRecorder):
    """The contract tier's recorder for one rank of a torch.distributed
    trainer (gloo, CPU): ContractRecorder's arguments, with `model` the
    DistributedDataParallel module (the plain module of a trainer that
    synchronises by hand: its all-reduces are then unseen, its gradients
    still judged).  ddp: the DistributedDataParallel module when `model`
    is the module inside it whose forward computes the loss, not DDP's own
    .module (Lightning's DDP wraps a wrapper that calls training_step):
    its forward says whether the coming backward all-reduces.  quiet
    defaults to True on every rank but 0.  Every
    rank must call optimizer.step() as often as the others (the step's fit
    gathers every rank's backward passes: a collective), and close().

    The epoch rows say this rank's shard: len(loader.sampler) samples (a
    DistributedSampler's share, padding included) where the loader has a
    sampler, else its dataset's size."""

    def __init__(self, model, optimizer, loss_fn, count_fn, accumulation, out="trace",
                 quiet=None, ddp=None, **kw):
        self.rank, self.world = _process_group()
        self.ddp = model if isinstance(model, DistributedDataParallel) else ddp
        if self.ddp is not None and not isinstance(self.ddp, DistributedDataParallel):
            raise Refused("ddp: expected the DistributedDataParallel module, got %s"
                          % type(self.ddp).__name__)
        self.sync_pending = False
        self.hand_reduces = 0  # gradient all-reduces the trainer made itself
        self._reduced = False  # one since the last backward (a sweep is one)
        self._sent = self._gathered = None  # _step_terms' matrices, kept across steps
        super().__init__(model.module if model is self.ddp else model, optimizer,
                         loss_fn, count_fn, accumulation, out=out,
                         quiet=(self.rank != 0) if quiet is None else quiet, **kw)
        if self.ddp is not None:
            self._hooks.append(self.ddp.register_forward_pre_hook(eager(self._ddp_forward)))
        self._live()

    def _ddp_forward(self, module, inputs):
        if _will_sync(module):
            self.sync_pending = True

    def _all_reduced(self, tensors):
        """A torch.distributed.all_reduce of the parameters' gradients made
        by the trainer: one all_reduce event per sweep over the parameters
        (the calls between two backward passes), at the micro-batch
        backwarded last.  Its scaling (SUM then / R, AVG, or no / R) is in
        the gradient the step consumes: the step fit and the weights."""
        if self._is_grad(tensors) and not self._reduced:
            self._reduced = True
            self.hand_reduces += 1
            self.events.append(("all_reduce", self.steps, self.current, None))

    def _new_epoch(self, loader):
        super()._new_epoch(loader)
        sampler = getattr(loader, "sampler", None)
        try:
            self.epochs[-1][0] = len(sampler)
        except TypeError:
            pass

    def _end_backward(self):
        super()._end_backward()
        self._reduced = False
        if self.sync_pending:
            self.sync_pending = False
            self.events.append(("all_reduce", self.steps, self.current, None))

    def _step_terms(self):
        """The previous step's gradient (this rank's) and every rank's
        backward passes since the previous step, all-gathered: refs
        'q:b' (rank q's backward b), renumbered by the merge.  Two tensor
        all-gathers (PyTorch's own, not a wrapper the trainer installed):
        each rank's count, then its rows padded to the largest count, the
        backward's index in an extra column (exact in float64);
        all_gather_object's pickling was half the recorder's cost.  The
        rows land in one matrix kept across steps, after the previous
        step's gradient, so where every rank sent as many rows (the usual
        case) the terms are a view of it, not a copy.  A recorder class
        that sends a _step_payload gathers it as an object (every rank is
        of the same class)."""
        gather = dist.distributed_c10d.all_gather
        mine = len(self.since_step)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        gather(counts, torch.tensor([mine], dtype=torch.int64))
        counts = [int(c) for c in counts]
        top, n = max(counts), self.buf.m.shape[1]
        if self._sent is None or self._sent.shape[0] < top:
            self._sent = torch.zeros((top, n + 1), dtype=torch.float64)
            self._gathered = torch.zeros((1 + self.world * top, n + 1), dtype=torch.float64)
        sent, every = self._sent[:top], self._gathered
        sent[:mine, :n] = self.buf.m[1:1 + mine]
        sent[:mine, n] = torch.tensor(self.since_step, dtype=torch.float64)
        parts = [every[1 + q * top:1 + (q + 1) * top] for q in range(self.world)]
        gather(parts, sent)
        if type(self)._step_payload is not ContractDistributedRecorder._step_payload:
            extra = [None] * self.world
            dist.all_gather_object(extra, self._step_payload())
            self._step_gathered(extra)
        refs = [-1] if self.has_prev else []
        for q, (c, m) in enumerate(zip(counts, parts)):
            refs += ["%d:%d" % (q, int(b)) for b in m[:c, n].tolist()]
        if self.has_prev:
            every[0, :n] = self.buf.m[0]
        first = 0 if self.has_prev else 1
        if all(c == top for c in counts):
            return every[first:1 + self.world * top, :n], refs
        rows = ([every[0:1, :n]] if self.has_prev else []) + [m[:c, :n] for c, m in
                                                              zip(counts, parts)]
        return torch.cat(rows), refs

    def _step_payload(self):
        """What else this rank sends with its backward passes at a step."""
        return None

    def _step_gathered(self, payloads):
        """Every rank's _step_payload() of this step, in rank order."""

    def _reduces_seen(self):
        return self.ddp is not None

    def _write(self, meta, events, rows):
        if self._reduces_seen() or self.hand_reduces:
            # certify judges the all-reduces per step only where they were
            # seen: DDP's (or FSDP's reduce-scatters), or the trainer's own
            # torch.distributed.all_reduce of the gradients.
            meta = meta + [("all_reduces", "seen")]
        extra = self._extra_files()

        def write(parts):
            m, e, _ = merge_parts([(r, m, e, []) for r, m, e, _ in parts])
            text = merge_contract_parts([(r, c) for r, _, _, c in parts])
            write_trace(self.out, m, e, [], extra=dict(extra, **{"contract.csv": text}),
                        ranks=True)
        self._gather_write((self.rank, meta, events, rows), write)


# The names published here before the FSDP recorders moved to fsdp.py.
_MOVED = {"ContractFSDPRecorder": "fsdp", "ContractFSDP1Recorder": "fsdp"}


def __getattr__(name):
    """`from accumcheck_torch.distributed import ContractFSDPRecorder`, as
    docs/memory-systems.md published it: the class from fsdp.py (imported
    on first use: this module does not import the ones built on it)."""
    if name in _MOVED:
        import importlib
        return getattr(importlib.import_module("." + _MOVED[name], __package__), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
