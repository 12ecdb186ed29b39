"""Starting a trainer's ranks and ending their processes: run_ranks (under
torchrun, or R processes spawned here), launch (torch.multiprocessing
with a gloo process group) and exit_rank (a rank's process ended without
the interpreter's finalization, which can abort or hang with gloo's
worker threads: its docstring says why)."""

import atexit
import gc
import sys

import torch.distributed as dist

from .trace import exit_on_refusal


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
