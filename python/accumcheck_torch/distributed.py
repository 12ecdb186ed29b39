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
"""

import atexit
import gc
import itertools
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .contract import CONTRACT_HEADER, ContractRecorder
from .recorder import Recorder, at_backward_end, eager
from .trace import Recording, Refused, exit_on_refusal, stopped_by, write_trace


def _process_group():
    """(rank, world size) of the initialised default process group."""
    if not (dist.is_available() and dist.is_initialized()):
        raise Refused("no torch.distributed process group "
                      "(call torch.distributed.init_process_group first)")
    return dist.get_rank(), dist.get_world_size()


def _will_sync(module):
    """DDP prepares the reducer (the coming backward all-reduces) when
    gradients are enabled and no_sync() is not active."""
    return torch.is_grad_enabled() and module.require_backward_grad_sync


# The rank recorders of this process not yet closed, and the
# torch.distributed functions wrapped while any lives (name -> PyTorch's).
_LIVE = []
_SAVED = {}
_WRAPPED = ("all_reduce", "all_reduce_coalesced", "destroy_process_group")


def _install():
    """torch.distributed's all_reduce, all_reduce_coalesced and
    destroy_process_group through the live recorders (both module names
    PyTorch binds them to; a name imported from them before the first
    recorder existed is PyTorch's own)."""
    if _SAVED:
        return
    c10d = dist.distributed_c10d
    for name in _WRAPPED:
        orig = _SAVED[name] = getattr(c10d, name)
        wrapper = _destroy if name == "destroy_process_group" else _reduce_wrapper(orig)
        for mod in (dist, c10d):
            setattr(mod, name, wrapper)


def _uninstall():
    for name, orig in _SAVED.items():
        for mod in (dist, dist.distributed_c10d):
            setattr(mod, name, orig)
    _SAVED.clear()


def _reduce_wrapper(orig):
    def all_reduce(tensor, *a, **k):
        out = orig(tensor, *a, **k)
        for rec in list(_LIVE):
            rec._all_reduced(tensor if torch.is_tensor(tensor) else list(tensor))
        return out
    all_reduce.__doc__ = orig.__doc__
    return all_reduce


def _destroy(group=None, *a, **k):
    """torch.distributed.destroy_process_group, after the live recorders
    end (the default group only): each closes, gathering its part while
    the group still exists -- or, when an exception propagates, is
    abandoned (its hooks removed, no trace written, nothing collective).
    Then the garbage collector runs, so a DDP module the trainer no longer
    holds goes with its reducer while the group lives (a reducer that
    outlives the group ends gloo's workers from its destructor, holding
    the interpreter lock one of them may wait for)."""
    orig = _SAVED.get("destroy_process_group", dist.distributed_c10d.destroy_process_group)
    if group is None or group is dist.GroupMember.WORLD:
        _end_all("torch.distributed.destroy_process_group()")
    return orig(group, *a, **k)


def _end_all(why):
    for rec in list(_LIVE):
        rec._end(why)
    gc.collect()


_EXIT = "the interpreter's exit"


@atexit.register
def _at_exit():
    """A recorder never closed ends at the interpreter's exit, before its
    teardown (atexit handlers run while threads may still take the
    interpreter lock): it closes -- every rank exits this way -- unless an
    unhandled exception ended the script or the process group is gone."""
    if _LIVE:
        _end_all(_EXIT)


class _RankLife:
    """How a rank recorder ends, whatever order the trainer's script ends
    in: close() then destroy_process_group(), destroy_process_group()
    first (it closes the recorder before the group goes), or, without
    either, the interpreter's exit or an exception (abandoned: no trace,
    nothing collective, its marker saying why).  Each way removes every
    hook and wrapper, so the recorder keeps no DDP module alive into the
    interpreter's teardown."""

    def _start_recording(self):
        """Started by _live, with the rank (the base class's is a
        one-process recording)."""

    def _live(self):
        self.abandoned = None
        _LIVE.append(self)
        _install()
        bundle = getattr(self, "bundle", None)
        self._recording = Recording(self.out, self.rank, self.world,
                                    planned=getattr(bundle, "steps", None),
                                    on_exit=self._abandon)

    def _mark(self, state, why=""):
        """This rank's marker (trace.Recording): how far it got, so a run
        one rank does not finish leaves a folder certify refuses naming
        that rank.  Rewritten after every backward and step."""
        rec = getattr(self, "_recording", None)
        if rec is None:
            return
        b = self.backwards
        rec.progress(self.steps, b if isinstance(b, int) else len(b), write=state == "recording")
        if state == "ended":
            rec.end(why)

    def _progress(self, write):
        if not self.closed:
            self._mark("recording")

    def _end(self, why):
        if self.closed:
            return
        at_exit = why == _EXIT
        stop = stopped_by(at_exit=at_exit)
        if stop:
            self._abandon("an exception ended the trainer before close() (%s)" % stop)
        elif not dist.is_initialized():
            self._abandon("the process group was destroyed before close() (through a name "
                          "imported before the recorder existed)")
        elif at_exit:
            self._abandon("the interpreter exited without the recorder's close() (call "
                          "recorder.close(), or destroy_process_group(), at the end of training)")
        else:
            self.close()

    def _abandon(self, why, say=True):
        if self.abandoned:
            return
        self.abandoned = why
        self._mark("ended", why)
        if say:
            print("accumcheck_torch: rank %d: %s: the recorder ends without writing a trace"
                  % (self.rank, why), file=sys.stderr)
        self._recompute_pending = lambda: None  # nothing more is computed
        self.close()

    def close(self):
        if self.closed:
            return
        try:
            super().close()
        finally:
            if self in _LIVE:
                _LIVE.remove(self)
            if not _LIVE:
                _uninstall()

    def _gather_write(self, part, write):
        self._together(lambda: _write_on_rank0(part, write))

    def _together(self, collective):
        """close()'s collective (every rank's part gathered, or every stage
        at close()): nothing when abandoned; a failure (a rank gone) leaves
        this rank's marker ended, saying so."""
        if self.abandoned:
            return
        if not dist.is_initialized():
            self._refuse("rank %d: close() after torch.distributed.destroy_process_group(): "
                         "the ranks' parts cannot be gathered; close() the recorder before "
                         "destroying the process group" % self.rank)
        try:
            collective()
        except BaseException as e:
            self._mark("ended", "close(): gathering the ranks' parts failed (%s: %s)"
                       % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            raise

    def _is_grad(self, tensors):
        """Whether the all-reduced tensors are parameters' gradients."""
        ptrs = {p.grad.data_ptr() for p in self.params if p.grad is not None}
        ts = tensors if isinstance(tensors, list) else [tensors]
        return bool(ts) and all(torch.is_tensor(t) and t.data_ptr() in ptrs for t in ts)


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


def _write_on_rank0(part, write):
    """Gathers every rank's part on rank 0, which calls write(parts); every
    rank returns once the trace is written (a collective)."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(part, parts, dst=0)
    if parts is not None:
        write(parts)
    dist.barrier()


def _fields(row, n):
    return row.rstrip("\n").split(",", n)


def merge_parts(parts):
    """Every rank's (rank, meta, events rows, values rows) -> one trace's
    (meta, events, values) with the rank column.

    Events: each step's rows (the `step` column) rank by rank in turn --
    each rank's i-th row of the step, then its (i+1)-th -- as accumcheck's
    own trainer writes them; an `all_reduce` once, as the collective (rank
    -1, from rank 0's part).  Values: rank 0's gradient and parameters,
    the other ranks' parameters.  meta: rank 0's, with every rank's notes
    and unseen, and whether the ranks saw the same number of all-reduces."""
    parts = sorted(parts, key=lambda p: p[0])
    by_step = []  # per rank: {step: [rows]}
    steps = set()
    reduces = []
    for rank, _, events, _ in parts:
        d = {}
        n = 0
        for row in events:
            f = _fields(row, 5)
            d.setdefault(int(f[2]), []).append((f[4], row.rstrip("\n")))
            n += f[4] == "all_reduce"
        by_step.append((rank, d))
        reduces.append(n)
        steps.update(d)
    out_events = []
    for step in sorted(steps):
        lists = [(rank, d.get(step, [])) for rank, d in by_step]
        for row_set in itertools.zip_longest(*[rows for _, rows in lists]):
            for (rank, _), item in zip(lists, row_set):
                if item is None:
                    continue
                kind, row = item
                if kind == "all_reduce":
                    if rank == 0:
                        out_events.append(row + ",-1\n")
                else:
                    out_events.append("%s,%d\n" % (row, rank))
    # Step by step: rank 0's gradient and parameters, then each other
    # rank's parameters.
    value_rows = {}
    for rank, _, _, values in parts:
        for row in values:
            f = _fields(row, 3)
            if rank == 0 or f[2] == "param":
                value_rows.setdefault((int(f[1]), rank), []).append(
                    "%s,%d\n" % (row.rstrip("\n"), rank))
    out_values = [row for key in sorted(value_rows) for row in value_rows[key]]
    meta = [(k, v) for k, v in parts[0][1] if k not in ("notes", "unseen")]
    notes, unseen = [], []
    for rank, m, _, _ in parts:
        md = dict(m)
        for key, into in (("notes", notes), ("unseen", unseen)):
            if md.get(key):
                into.append(md[key] if len(parts) == 1 else "rank %d: %s" % (rank, md[key]))
    if len(set(reduces)) > 1:
        unseen.append("the ranks saw different numbers of all-reduces (%s): a collective "
                      "the recorder did not see" % ", ".join(
                          "rank %d: %d" % (p[0], n) for p, n in zip(parts, reduces)))
    meta.append(("ranks", str(len(parts))))
    if notes:
        meta.append(("notes", " | ".join(notes)))
    if unseen:
        meta.append(("unseen", " | ".join(unseen)))
    return meta, out_events, out_values


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


def merge_contract_parts(parts):
    """Every rank's (rank, contract.csv rows) -> one contract.csv with the
    rank column: micro-batch, backward and clip indices renumbered over
    the ranks (rank 0's first), a coef row's 'q:b' made rank q's
    backward b's index; step and epoch indices stay per rank."""
    parts = sorted(parts, key=lambda p: p[0])
    offsets, at = {}, [0, 0, 0]  # micro, backward, clip
    for rank, rows in parts:
        offsets[rank] = list(at)
        for row in rows:
            kind = row.split(",", 1)[0]
            if kind in ("micro", "backward", "clip"):
                at[("micro", "backward", "clip").index(kind)] += 1
    out = []
    for rank, rows in parts:
        om, ob, oc = offsets[rank]
        for row in rows:
            f = row.rstrip("\n").split(",")
            if f[0] == "micro":
                f[1] = str(int(f[1]) + om)
            elif f[0] == "backward":
                f[1], f[2] = str(int(f[1]) + ob), str(int(f[2]) + om)
            elif f[0] == "clip":
                f[1] = str(int(f[1]) + oc)
            elif f[0] == "coef" and ":" in f[2]:
                q, b = f[2].split(":")
                f[2] = str(offsets[int(q)][1] + int(b))
            out.append(",".join(f) + ",%d\n" % rank)
    # Every rank's micro-batches and backward passes before any step's
    # rows: a coef row may name another rank's backward.
    first = [r for r in out if r.startswith(("micro,", "backward,"))]
    rest = [r for r in out if not r.startswith(("micro,", "backward,"))]
    return CONTRACT_HEADER + ",rank\n" + "".join(first + rest)


def run_ranks(main, args, spawn=None):
    """main(rank, ranks, args) in this process under torchrun (its
    environment: init_process_group("gloo")), or, with spawn = R, in R
    processes started here (launch).  A rank that returns ends its process
    through exit_rank(0): under torchrun this call does not return."""
    if spawn:
        launch(main, spawn, args)
        return
    dist.init_process_group("gloo")
    _rank_body(main, dist.get_rank(), dist.get_world_size(), (args,))


def launch(main, ranks, *args):
    """Runs main(rank, ranks, *args) in `ranks` processes joined in a gloo
    process group on this machine (torch.multiprocessing.spawn), for
    trainers not started by torchrun.  Exits like the worst rank.  A
    spawned rank that returns ends through exit_rank(0); a forked one
    (ACCUMCHECK_START_METHOD=fork or forkserver) through multiprocessing's
    os._exit, as before."""
    import os
    import socket
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    method = os.environ.get("ACCUMCHECK_START_METHOD", "spawn")
    try:
        mp.start_processes(_spawned, args=(main, ranks, args, method == "spawn"), nprocs=ranks,
                           join=True, start_method=method)
    except mp.ProcessExitedException as e:
        # A rank that exited (a Refused one: 2) ends the run with its code,
        # not a traceback of the spawning process.
        sys.stderr.write("accumcheck_torch: rank %d exited with code %s\n" % (e.error_index, e.exit_code))
        sys.exit(e.exit_code if isinstance(e.exit_code, int) and e.exit_code > 0 else 1)


def _spawned(rank, main, ranks, args, fresh):
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    _rank_body(main, rank, ranks, args, end=fresh)


def _rank_body(main, rank, ranks, args, end=True):
    """main(rank, ranks, *args), the process group destroyed after it, and,
    with `end` (a fresh interpreter: spawned, or under torchrun), the
    process ended by exit_rank(0) when main returned.  The default
    group's Python object is held to the end, so destroy_process_group()
    never runs gloo's destructor here (it joins the worker threads while
    this thread holds the interpreter lock, which a worker may be waiting
    for: the hang exit_rank's docstring describes).  An exception leaves as
    it would without this (torch.multiprocessing reports it)."""
    group = dist.group.WORLD
    try:
        # A refused rank exits 2 with the message, as a script does.
        exit_on_refusal(main, rank, ranks, *args)
    finally:
        dist.destroy_process_group()
    if end:
        exit_rank(0, keep=group)


def exit_rank(code=0, keep=None):
    """Ends this rank's process the way the interpreter's exit would, minus
    its finalization: non-daemon threads joined, every atexit handler run
    (the live rank recorders close there, multiprocessing's and logging's
    handlers run), every open Python file flushed, then os._exit(code).
    Call it as the last statement of a rank's function in a launcher of
    your own that starts fresh interpreters (torch.multiprocessing.spawn,
    torchrun); launch() and run_ranks() call it.  Not in a forked rank: it
    would run the atexit handlers the parent registered, and a forked
    rank leaves through os._exit already.  `keep`: objects held until the end
    (the process group, so that nothing here destroys it).

    Why: PyTorch's gloo backend runs each collective on a worker thread
    (pt_gloo_runloop), which drops its references to the collective's
    tensors only after the caller has been woken.  When Python has
    already dropped such a tensor (gather_object's temporaries in a
    recorder's close(), any collective's temporary), the worker's release
    is the last one and frees the tensor's Python object, which needs the
    interpreter lock.  If the worker waits for the lock while the
    interpreter's finalization begins, CPython before 3.14 ends it with
    pthread_exit, whose unwinding through PyTorch's noexcept TensorImpl
    destructor calls std::terminate: "terminate called without an active
    exception", the rank killed by SIGABRT (exit -6) after its work was
    done (python/cpython#87135, pytorch/pytorch#38228;
    tests/pytorch/spawn_exit.py reproduces it).  If instead the process
    group is destroyed while such a release is pending (its last
    reference dropped by destroy_process_group(), or by the collection
    that frees a DDP module), gloo's destructor joins that worker on the
    thread holding the lock the worker waits for: a hang.  CPython 3.14
    parks the worker instead of ending it, which trades the abort for
    that hang wherever finalization then destroys the group.  A process
    that never finalizes its interpreter has neither; a forked rank leaves
    through os._exit too, without the atexit handlers.  Python files
    still open are flushed here; the process group and every C++ object
    are left to the operating system, as at any process exit."""
    import io
    import os
    import threading

    try:
        threading._shutdown()  # what Py_FinalizeEx does first: the non-daemon threads
        atexit._run_exitfuncs()
        for f in gc.get_objects():
            if isinstance(f, io.IOBase):
                try:
                    if not f.closed and f.writable():
                        f.flush()
                except Exception:  # as the interpreter's own flush at exit: ignored
                    pass
        for f in (sys.stdout, sys.stderr):
            if f is not None:
                f.flush()
    finally:
        os._exit(code)


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
