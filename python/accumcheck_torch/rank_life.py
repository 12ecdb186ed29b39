"""A rank recorder's life inside torch.distributed: the process group it
records in, the torch.distributed functions wrapped while any rank
recorder of this process lives (all_reduce and all_reduce_coalesced seen
by each live recorder; destroy_process_group, which first ends them), how
a rank recorder ends (_RankLife: close(), destroy_process_group(), an
exception or the interpreter's exit) and close()'s collective (every
rank's part gathered on rank 0, which writes the trace).  The rank
recorders (distributed.py, fsdp.py, pipelining.py, deepspeed.py) are
built on it; it knows none of them."""

import atexit
import gc
import sys

import torch
import torch.distributed as dist

from .trace import Recording, Refused, stopped_by


def _process_group():
    """(rank, world size) of the initialised default process group."""
    if not (dist.is_available() and dist.is_initialized()):
        raise Refused("no torch.distributed process group "
                      "(call torch.distributed.init_process_group first)")
    return dist.get_rank(), dist.get_world_size()


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


def _write_on_rank0(part, write):
    """Gathers every rank's part on rank 0, which calls write(parts); every
    rank returns once the trace is written (a collective)."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(part, parts, dst=0)
    if parts is not None:
        write(parts)
    dist.barrier()
