"""A spawned rank's exit while gloo's worker thread still holds a collective's
tensor (issue 42): the abort at exit, and exit_rank without it.

    python3 spawn_exit.py [--runs N] [--timeout S]

Rank 1 leaves gloo's worker thread (pt_gloo_runloop) the last reference to
a tensor that has a Python object: an all-reduce started with
async_op=True whose tensor and work it drops at once, and which rank 0
joins only once rank 1 is in its last atexit handler.  That handler holds
the interpreter lock in C for 2 s (ctypes.PyDLL's usleep keeps it), so
the worker finishes the all-reduce, starts freeing the tensor's Python
object and waits for the lock; a buffered write is left in sys.stdout,
whose flush at the start of finalization releases the lock to the worker.
What happens then depends only on how the rank leaves:

  interpreter  the rank function returns, the process group alive (as when
               a DDP module outlives destroy_process_group()): the
               interpreter finalizes and CPython (before 3.14) ends the
               waiting worker with pthread_exit, whose unwinding through
               PyTorch's noexcept TensorImpl destructor calls
               std::terminate: "terminate called without an active
               exception", rank 1 killed by SIGABRT (exit -6)
  exit_rank    the same rank run by accumcheck_torch.distributed.launch,
               which ends each rank with exit_rank(0): the atexit handlers
               run, the worker takes the lock while the interpreter is
               whole, then os._exit(0)

Passes ("spawn_exit: ok") when every `interpreter` run aborted (the hazard
is real on this PyTorch and CPython: if it stops reproducing, the message
says so and the test fails, so that this test and exit_rank are looked at
again) and every `exit_rank` run exited 0 with no "terminate called".
Each run is 2 spawned ranks (fresh interpreters, about 3 s of CPU each),
launched from this process (no launcher interpreter of its own; under CTest
this process is itself a fork of the warm Python, warm_python.py exec).
"""
import argparse
import atexit
import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

KEY = "rank1-exiting"


def hazard(rank, ranks):
    """The rank function's body: rank 1 leaves the worker the tensor."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.wait([KEY])          # rank 1 is in its last atexit handler
        time.sleep(0.5)
        dist.all_reduce(torch.ones(4))
        return
    t = torch.ones(4)
    work = dist.all_reduce(t, async_op=True)
    del t, work                    # the worker holds the tensor's last reference
    sys.stdout = open(os.devnull, "w")   # block-buffered: its flush releases the lock
    atexit._clear()                # rank 1's handlers, in the order they run:
    atexit.register(sys.stdout.write, "left in the buffer for finalization's flush\n")
    atexit.register(ctypes.PyDLL(None).usleep, 2000000)   # the lock held, in C
    atexit.register(store.set, KEY, "1")


def interpreter_rank(rank, ranks):
    from accumcheck_torch.distributed import exit_rank
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    group = dist.group.WORLD
    hazard(rank, ranks)
    if rank == 0:
        dist.destroy_process_group()
        exit_rank(0, keep=group)
    globals()["_kept"] = group     # the group lives into the interpreter's exit


def launched_rank(rank, ranks, _args):
    hazard(rank, ranks)


def child(mode):
    """One 2-rank run launched from this process: 0 when the launcher
    returned, 1 when a rank's exit failed it (said on stdout)."""
    import socket
    import torch.multiprocessing as mp
    from accumcheck_torch.distributed import launch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["ACCUMCHECK_START_METHOD"] = "spawn"
    if mode == "exit_rank":
        launch(launched_rank, 2, None)
        return 0
    try:
        mp.start_processes(interpreter_rank, args=(2,), nprocs=2, join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        print("spawn_exit: rank %d exited with code %s" % (e.error_index, e.exit_code))
        return 1
    return 0


def captured(mode):
    """child(mode) with this process's and its ranks' stdout and stderr
    (fds 1 and 2, which spawned ranks inherit) into a file: (code, text).
    The launcher is this process, not a fresh interpreter of its own: it
    has imported torch already (a fresh one costs 3 to 4 s of CPU, the
    runs' ranks are the only other interpreters)."""
    import tempfile
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            code = child(mode)
        except Exception as e:  # noqa: BLE001  said, and the run fails
            print("spawn_exit: the launcher raised %r" % e)
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        f.seek(0)
        return code, f.read()


def main():
    import faulthandler
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of each way out (default 1)")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    # The stacks of a hang go to this stderr, not to a run's captured one.
    stacks = os.fdopen(os.dup(2), "w")
    ok = True
    for mode in ("interpreter", "exit_rank"):
        for i in range(a.runs):
            t0 = time.monotonic()
            # A hang: faulthandler prints "Timeout" and the stacks, and exits 1
            # (no "spawn_exit: ok").
            faulthandler.dump_traceback_later(a.timeout, exit=True, file=stacks)
            code, out = captured(mode)
            faulthandler.cancel_dump_traceback_later()
            aborted = ("terminate called without an active exception" in out
                       and "rank 1 exited with code -6" in out)
            print("spawn_exit: %s run %d: launcher %s%s (%.1f s)" % (
                mode, i, "returned" if code == 0 else "failed",
                ", rank 1 aborted (SIGABRT, std::terminate)" if aborted else "",
                time.monotonic() - t0), flush=True)
            if mode == "interpreter" and not aborted:
                print("spawn_exit: the hazard did not reproduce: rank 1 left through its interpreter's "
                      "exit without the abort (a PyTorch or CPython that no longer ends the worker "
                      "there?): look at exit_rank and this test again\n" + out[-3000:])
                ok = False
            if mode == "exit_rank" and (code != 0 or "terminate called" in out):
                print("spawn_exit: exit_rank did not end the ranks cleanly\n" + out[-3000:])
                ok = False
    print("spawn_exit: ok" if ok else "spawn_exit: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
