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
"""

import atexit
import copy
import gc
import itertools
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .contract import CONTRACT_HEADER, ContractRecorder, _tensors
from .recorder import Recorder, at_backward_end, eager
from .trace import Refused, clear_rank_markers, write_rank_marker, write_trace


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


def _exception_pending():
    """An exception propagates (a `finally` or `with` is running because of
    it), or the interpreter exits after an unhandled one."""
    e = sys.exc_info()[1]
    if e is not None and not (isinstance(e, SystemExit) and not e.code):
        return True
    return getattr(sys, "last_value", None) is not None


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


@atexit.register
def _at_exit():
    """A recorder never closed ends at the interpreter's exit, before its
    teardown (atexit handlers run while threads may still take the
    interpreter lock): it closes -- every rank exits this way -- unless an
    unhandled exception ended the script or the process group is gone."""
    if _LIVE:
        _end_all("the interpreter's exit")


class _RankLife:
    """How a rank recorder ends, whatever order the trainer's script ends
    in: close() then destroy_process_group(), destroy_process_group()
    first (it closes the recorder before the group goes), neither (the
    interpreter's exit closes it), or an exception (abandoned: no trace,
    nothing collective).  Each way removes every hook and wrapper, so the
    recorder keeps no DDP module alive into the interpreter's teardown."""

    def _live(self):
        self.abandoned = None
        _LIVE.append(self)
        _install()
        self._mark("recording")

    def _mark(self, state, why=""):
        """This rank's marker (trace.write_rank_marker): how far it got,
        so a run one rank does not finish leaves a folder certify refuses
        naming that rank.  Rewritten after every backward and step."""
        b = self.backwards
        write_rank_marker(self.out, self.rank, self.world, state, self.steps,
                          b if isinstance(b, int) else len(b), why)

    def _end_backward(self):
        super()._end_backward()
        if not self.closed:
            self._mark("recording")

    def _after_step(self):
        super()._after_step()
        self._mark("recording")

    def _end(self, why):
        if self.closed:
            return
        if _exception_pending():
            e = sys.exc_info()[1] or getattr(sys, "last_value", None)
            said = str(e).strip().splitlines()[0][:200] if e is not None and str(e).strip() else ""
            self._abandon("an exception ended the trainer before close()" + (
                " (%s%s)" % (type(e).__name__, ": " + said if said else "") if e is not None else ""))
        elif not dist.is_initialized():
            self._abandon("the process group was destroyed before close() (through a name "
                          "imported before the recorder existed)")
        else:
            self.close()

    def _abandon(self, why):
        self.abandoned = why
        self._mark("ended", why)
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
            raise Refused("rank %d: close() after torch.distributed.destroy_process_group(): "
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


class _GatheredReplica:
    """What the FSDP recorders share: `replica`, a plain module the
    recomputes run on, loaded with the whole parameters gathered at the
    start and after every step (a collective on every rank)."""

    def _take_replica(self, who, names, replica):
        if replica is None:
            raise Refused("%s needs replica=: a plain (unsharded) module of the same "
                          "architecture, e.g. built by the constructor you sharded" % who)
        theirs = [n for n, p in replica.named_parameters() if p.requires_grad]
        if names != theirs:
            raise Refused("replica: its parameters %s are not the model's %s (same names, "
                          "same order)" % (theirs[:4], names[:4]))
        self.replica_model = replica
        self.full = None

    def _replica(self, model):
        return copy.deepcopy(self.replica_model)

    def _source(self):
        return self.full

    def _reduces_seen(self):
        return True

    def _after_step(self):
        super()._after_step()
        self._gather_params()


class _ShardFit:
    """What the sharding recorders (FSDP2, FSDP1) share: each rank's step
    fit solves for its own shard of the consumed gradient -- what its
    optimizer steps -- over every rank's whole backward passes restricted
    to that shard, so a gradient scaled by a factor of the rank's own (a
    clip by the shard's norm: ddp-clip-local-norm) is seen as such, not
    as a change the recorder cannot explain; and each clip is recorded
    with the norm of this rank's shard of the gradient it saw and, once
    the ranks meet at the step, of the whole gradient (both in float64:
    certify judges the factor against the one the loop's clip gives).

    With a clip declared (clip=), a scaling of this rank's shard between
    the window's last backward and optimizer.step() that no clip function
    reported (p.grad.to_local().mul_(factor) after a norm of your own) is
    recorded as the loop's clip, with the factor it applied: the ratio of
    the consumed shard to the one the backward left (the step fit checks
    that it is one factor: anything else fails it)."""

    def _setup_shards(self):
        parts, self.local_sizes = [], []
        for (a, b), (start, size) in zip(self.buf.slices, self._shard_ranges()):
            parts.append(torch.arange(a + start, a + start + size))
            self.local_sizes.append(size)
        self.shard_idx = torch.cat(parts)
        self.snap = None     # this rank's shard of .grad when the last backward ended
        self.snap_clips = 0  # the clips seen before it
        self.hand_clip_noted = False  # the note on a scaling seen on .grad, said once

    def _local_flat(self, grads, strict=True):
        """This rank's shard of the gradients, float64, in shard_idx's
        order (zeros for a gradient that is None); not strict: None where
        a gradient is not the shard (FSDP1's under no_sync())."""
        out = torch.zeros(self.shard_idx.numel(), dtype=torch.float64)
        at = 0
        for p, g, size in zip(self.params, grads, self.local_sizes):
            if g is not None:
                g = self._local(g).detach().reshape(-1)
                if g.numel() != size:
                    if not strict:
                        return None
                    raise Refused("rank %d: a gradient of %d elements where the parameter's shard "
                                  "holds %d: not the sharded gradient the optimizer steps"
                                  % (self.rank, g.numel(), size))
                out[at:at + size].copy_(g)
            at += size
        return out

    def _consumed_vector(self, grads):
        G = self.vec[0].zero_()
        return G.index_copy_(0, self.shard_idx, self._local_flat(grads))

    def _fit_space(self, A, G, terms):
        if self.shard_idx.numel() < terms:
            raise Refused("rank %d: its shard holds %d gradient elements, fewer than the %d "
                          "vectors its step fit solves for: the fit would not be determined "
                          "(fewer ranks, or a larger model)"
                          % (self.rank, self.shard_idx.numel(), terms))
        return A.index_select(1, self.shard_idx), G.index_select(0, self.shard_idx)

    def _clip_norms(self, parameters):
        """The shard's norm now; the whole gradient's at the step (its
        ranks' shard norms, gathered)."""
        with torch.no_grad():
            sq = sum(float(self._local(p.grad.detach()).double().pow(2).sum())
                     for p in parameters if p.grad is not None)
        return float("nan"), sq ** 0.5

    def _end_backward(self):
        super()._end_backward()
        if self.clip_max is not None:
            self.snap = self._local_flat([p.grad for p in self.params], strict=False)
            self.snap_clips = len(self.clips)

    def _before_step(self):
        snap, self.snap = self.snap, None
        if snap is not None and len(self.clips) == self.snap_clips:
            now = self._local_flat(self._consumed())
            ss = float(snap.dot(snap))
            if ss > 0 and not torch.equal(now, snap):
                factor = float(now.dot(snap)) / ss
                if not self.hand_clip_noted:
                    self.hand_clip_noted = True
                    self.notes.append(
                        "its shard of .grad scaled between the window's last backward and "
                        "optimizer.step() by no clip function the recorder saw (step %d: factor "
                        "%.6g): recorded as the loop's clip (clip=%g declared)"
                        % (self.steps, factor, self.clip_max))
                self._clipped(factor, float("nan"), ss ** 0.5, float("nan"))
        super()._before_step()

    def _step_payload(self):
        return [c[4] for c in self.clips if c[0] == self.steps]

    def _step_gathered(self, payloads):
        """Each clip of this step: the whole gradient's norm from every
        rank's shard norm of its clip in the same place."""
        mine = [c for c in self.clips if c[0] == self.steps]
        if len({len(p) for p in payloads}) > 1:
            self.notes.append("step %d: the ranks clipped %s times: the whole gradient's norm "
                              "at each clip is not known" % (self.steps, "/".join(
                                  str(len(p)) for p in payloads)))
            return
        for k, c in enumerate(mine):
            c[2] = sum(p[k] ** 2 for p in payloads) ** 0.5


class ContractFSDPRecorder(_ShardFit, _GatheredReplica, ContractDistributedRecorder):
    """The contract tier's recorder for one rank of an FSDP2 trainer
    (torch.distributed.fsdp.fully_shard, gloo on CPU): ContractRecorder's
    arguments, with `model` the fully_shard'ed root module and `replica` a
    plain (unsharded) module of the same architecture, with the same
    parameter names (built again by your own constructor: its values do
    not matter, the recorder loads the gathered parameters into it).

    What FSDP2 hides and how it is seen:
      - each backward's gradient: FSDP2 computes it on the unsharded
        parameters (each FSDPParam's unsharded nn.Parameter, made at the
        first all-gather) and writes only the reduce-scattered shard into
        the sharded parameter's .grad; the recorder hooks the unsharded
        parameters after the first forward, so c_b is this rank's whole
        local gradient (as under DDP, before any communication);
      - the gradient a step consumes: the sharded .grad gathered into the
        whole tensor (DTensor.full_tensor(), an all-gather per parameter
        per step: every rank steps together), the same on every rank;
      - the optimizer steps on shards: the replay steps this rank's shards
        (to_local) with this rank's shard of the optimizer state;
      - g_j: recomputed on the replica loaded with the parameters gathered
        after each step (never taken from your forward: FSDP's backward
        hooks would run inside the recorder's own autograd.grad);
      - gradient sync: a backward whose FSDP parameter groups reduce
        (set_requires_gradient_sync left on) is a reduce-scatter, recorded
        as the step's gradient collective (an all_reduce event: averaged
        over the ranks as DDP's all-reduce is), so certify counts them."""

    def __init__(self, model, optimizer, loss_fn, count_fn, accumulation, replica=None, **kw):
        from torch.distributed.fsdp import FSDPModule
        if not isinstance(model, FSDPModule):
            raise Refused("ContractFSDPRecorder takes the fully_shard'ed root module; got %s"
                          % type(model).__name__)
        self._take_replica("ContractFSDPRecorder",
                           [n for n, p in model.named_parameters() if p.requires_grad], replica)
        self.groups = [g for m in model.modules() if isinstance(m, FSDPModule)
                       for g in m._get_fsdp_state()._fsdp_param_groups]
        self.unsharded_hooked = False
        super().__init__(model, optimizer, loss_fn, count_fn, accumulation, **kw)
        self._setup_shards()
        self._gather_params()

    def _shard_ranges(self):
        """Each parameter's shard on this rank: FSDP2's dim-0 chunk of the
        DTensor, as (first element in the flattened parameter, elements)."""
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        out = []
        for p in self.params:
            if not isinstance(p, DTensor) or any(type(pl) is not Shard or pl.dim != 0
                                                 for pl in p.placements):
                raise Refused("ContractFSDPRecorder: a parameter %s is not sharded on dim 0 "
                              "(placements %s): the recorder fits each rank's dim-0 shard"
                              % (tuple(p.shape), getattr(p, "placements", "none")))
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                  p.placements)
            row = p.numel() // p.shape[0] if p.dim() and p.shape[0] else 0
            out.append((offset[0] * row if p.dim() else 0, p.to_local().numel()))
        return out

    def _full(self, t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    def _local(self, t):
        return t.to_local() if isinstance(t, DTensor) else t

    def _gather_params(self):
        """Every parameter gathered whole (a collective: at the start and
        after every step, on every rank)."""
        with torch.no_grad():
            self.full = [self._full(p.detach()) for p in self.params]

    def _take_from_forward(self, j, pending, output):
        """Hooks the unsharded parameters once they exist (after the first
        forward); g_j always comes from the replica."""
        if self.unsharded_hooked:
            return
        index = {id(p): i for i, p in enumerate(self.params)}
        for g in self.groups:
            for fp in g.fsdp_params:
                i = index.get(id(fp.sharded_param))
                if i is None or getattr(fp, "_unsharded_param", None) is None:
                    continue
                self._hooks.append(fp._unsharded_param.register_hook(self._grad_hook(i)))
        self.unsharded_hooked = True

    def _end_backward(self):
        if any(g.reduce_grads for g in self.groups):
            self.sync_pending = True
        super()._end_backward()


class ContractFSDP1Recorder(_ShardFit, _GatheredReplica, ContractDistributedRecorder):
    """The contract tier's recorder for one rank of an FSDP1 trainer
    (torch.distributed.fsdp.FullyShardedDataParallel with
    use_orig_params=True; on CPU with device_id=torch.device("cpu") and
    gloo): ContractRecorder's arguments, with `model` the root
    FullyShardedDataParallel module and `replica` a plain module of the
    same architecture (the same parameter names, FSDP's wrapper prefixes
    left out).

    What FSDP1 hides and how it is seen:
      - each backward's gradient: FSDP1 computes it on each FlatParameter
        unsharded (its views are what the forward uses) and reduce-scatters
        it, or under no_sync() keeps it unsharded; the recorder hooks each
        FlatParameter, so c_b is this rank's whole local gradient of every
        parameter (the flat gradient cut by FSDP's own views, padding left
        out), before any communication;
      - the gradient a step consumes: this rank's shard of it (the
        original parameters' local .grad, each a slice of the flattened
        parameter: FSDP's _shard_param_infos), fitted over the backward
        passes restricted to that slice; the parameters after each step
        gathered whole (FullyShardedDataParallel.summon_full_params, a
        collective on every rank at every step) for the replica;
      - the optimizer steps the original parameters' local shards: the
        replay steps them with their own .grad and optimizer state;
      - gradient sync: a backward outside no_sync() reduce-scatters (the
        root's _sync_gradients at the backward's end), recorded as the
        step's gradient collective, so certify counts them;
      - clip: FSDP1's own model.clip_grad_norm_ (the whole gradient's
        norm, all-reduced: the right clip) is seen on the root module, as
        torch.nn.utils.clip_grad_norm_ is (on FSDP1's shards: each rank's
        shard's norm, ddp-clip-local-norm)."""

    def __init__(self, model, optimizer, loss_fn, count_fn, accumulation, replica=None, **kw):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp._common_utils import clean_tensor_name
        from .contract import _Rows
        if not isinstance(model, FSDP):
            raise Refused("ContractFSDP1Recorder takes the root FullyShardedDataParallel "
                          "module; got %s" % type(model).__name__)
        handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
        if not all(h._use_orig_params for h in handles):
            raise Refused("ContractFSDP1Recorder needs FullyShardedDataParallel(..., "
                          "use_orig_params=True): the optimizer must step the original "
                          "parameters the recorder replays")
        self._take_replica("ContractFSDP1Recorder",
                           [clean_tensor_name(n) for n, p in model.named_parameters()
                            if p.requires_grad], replica)
        self.fsdp, self.summon = model, FSDP.summon_full_params
        super().__init__(model, optimizer, loss_fn, count_fn, accumulation, **kw)
        # The parameters are local shards: every n-long vector holds the
        # whole parameters (the replica's shapes), and c_b comes from the
        # FlatParameters' hooks, not the shards' (which no backward reaches).
        whole = [p for p in self.replica_model.parameters() if p.requires_grad]
        self.n = sum(p.numel() for p in whole)
        self.buf = _Rows(whole, self.K + 2)
        self.vec = [torch.zeros(self.n, dtype=torch.float64) for _ in range(4)]
        index = {id(p): i for i, p in enumerate(self.params)}
        for h in handles:
            hooks = [None if index.get(id(p)) is None else self._grad_hook(index[id(p)])
                     for p in h.flat_param._params]
            self._hooks.append(h.flat_param.register_hook(self._flat_hook(h, hooks)))
        self.handles = handles
        self._setup_shards()
        self._gather_params()
        orig = model.clip_grad_norm_

        def clip_grad_norm_(max_norm, *a, **k):
            norm, shard = self._clip_norms(self.params)
            total = orig(max_norm, *a, **k)
            self._clipped(min(1.0, float(max_norm) / (float(total) + 1e-6)), norm, shard,
                          float(max_norm))
            return total
        model.clip_grad_norm_ = clip_grad_norm_

    def _unpatch(self):
        self.fsdp.__dict__.pop("clip_grad_norm_", None)
        super()._unpatch()

    def _shard_ranges(self):
        """Each original parameter's shard on this rank: a slice of its
        flattened whole (FSDP1's _shard_param_infos), or nothing."""
        info = {}
        for h in self.handles:
            for p, si in zip(h.flat_param._params, h.flat_param._shard_param_infos):
                info[id(p)] = si
        out = []
        for p in self.params:
            si = info[id(p)]
            out.append((si.intra_param_start_idx, si.intra_param_end_idx - si.intra_param_start_idx
                        + 1) if si.in_shard else (0, 0))
        return out

    @staticmethod
    def _flat_hook(handle, hooks):
        def hook(grad):
            for f, view in zip(hooks, handle._get_unflat_views(grad)):
                if f is not None:
                    f(view)
            return None
        return hook

    def _gather_params(self):
        with torch.no_grad(), self.summon(self.fsdp, writeback=False):
            self.full = [p.detach().clone() for p in self.params]

    def _take_from_forward(self, j, pending, output):
        """g_j always comes from the replica (FSDP's backward hooks would
        run inside the recorder's own autograd.grad)."""

    def _consumed(self):
        if any(p.grad is not None and p.grad.shape != p.shape for p in self.params):
            raise Refused(
                "rank %d: optimizer.step() on FSDP1 gradients that are still unsharded: the "
                "window's last backward ran under no_sync(), so nothing was reduce-scattered "
                "and the gradients do not fit the sharded parameters (PyTorch's optimizer "
                "fails on them with a size mismatch); run the window's last backward outside "
                "no_sync()" % self.rank)
        return [p.grad for p in self.params]

    def _end_backward(self):
        if self.fsdp._sync_gradients:
            self.sync_pending = True
        super()._end_backward()


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
        parts = _split(batch, self.n_micro)
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
            raise Refused("stage %d: schedule.step() on a batch not drawn from recorder.watch(loader)"
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
    processes started here (launch)."""
    if spawn:
        launch(main, spawn, args)
        return
    dist.init_process_group("gloo")
    try:
        main(dist.get_rank(), dist.get_world_size(), args)
    finally:
        dist.destroy_process_group()


def launch(main, ranks, *args):
    """Runs main(rank, ranks, *args) in `ranks` processes joined in a gloo
    process group on this machine (torch.multiprocessing.spawn), for
    trainers not started by torchrun.  Exits like the worst rank."""
    import os
    import socket
    import sys
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    try:
        mp.start_processes(_spawned, args=(main, ranks, args), nprocs=ranks, join=True,
                           start_method=os.environ.get("ACCUMCHECK_START_METHOD", "spawn"))
    except mp.ProcessExitedException as e:
        # A rank that exited (a Refused one: 2) ends the run with its code,
        # not a traceback of the spawning process.
        sys.stderr.write("accumcheck_torch: rank %d exited with code %s\n" % (e.error_index, e.exit_code))
        sys.exit(e.exit_code if isinstance(e.exit_code, int) and e.exit_code > 0 else 1)


def _spawned(rank, main, ranks, args):
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        main(rank, ranks, *args)
    finally:
        dist.destroy_process_group()
