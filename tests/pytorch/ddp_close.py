"""The DDP recorders close cleanly whatever order a script ends in.

    ddp_close.py [--ranks R] [--runs N] [--orders O,...] [--timeout S] [--work DIR]

runs N times each order with R gloo ranks and counts the runs that
hang (a rank still alive after S seconds: killed) or fail.  Each rank is a fork
of this process (torch imported once) that leaves through the
interpreter's own exit, as a script's process does.  Orders:

  close_destroy    recorder.close(), then dist.destroy_process_group()
  destroy_close    dist.destroy_process_group(), then recorder.close()
  exit             neither: the recorder and the process group are left to
                   the interpreter's exit (no trace: the recorder was not
                   closed, and its marker says so)
  destroy_only     dist.destroy_process_group(), the recorder never closed
  exception        an exception mid-run (at the second optimizer step, on
                   every rank), the script's `finally` destroys the group
  early_destroy    destroy_process_group through a name bound before the
                   recorder existed (which the recorder cannot see), then
                   recorder.close(): refused, exit 2 on every rank, no trace

A correct no_sync loop (K = 2) on a tiny model under DDP, recorded by
ContractDistributedRecorder.  The orders that close (or destroy) normally
must leave a trace certify passes; `exit`, `exception` and `early_destroy`
must leave none, and certify must refuse the folder (exit 2) naming how the
run ended.  Prints `driver: ok` when no run hung or failed."""

import argparse
import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

ORDERS = ("close_destroy", "destroy_close", "exit", "destroy_only", "exception", "early_destroy")
REFUSED = "close() after torch.distributed.destroy_process_group()"
# The orders that leave no trace, and what certify's refusal names.
UNFINISHED = {"exit": "the interpreter exited without the recorder's close()",
              "exception": "RuntimeError: the trainer's own error, mid-run",
              "early_destroy": "the recorder refused: rank "}


def rank_main(order, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumcheck_torch.distributed import ContractDistributedRecorder

    torch.set_num_threads(1)
    early = dist.destroy_process_group  # bound before the recorder exists
    dist.init_process_group("gloo")
    R = dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(6, generator=g), torch.randn(3, generator=g)) for _ in range(8 * R)]

    def summed(m, b):
        return ((m(b[0]) - b[1]) ** 2).sum()

    rec = ContractDistributedRecorder(model, opt, summed, lambda b: b[0].shape[0],
                                      accumulation=2, out=out, lr=0.1)
    sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
    try:
        batches = list(rec.watch(loader))
        for start in range(0, len(batches), 2):
            window = batches[start:start + 2]
            n = torch.tensor(float(sum(b[0].shape[0] for b in window)))
            dist.all_reduce(n)
            for i, b in enumerate(window):
                sync = contextlib.nullcontext() if i + 1 == len(window) else model.no_sync()
                with sync:
                    (summed(model, b) * R / n.item()).backward()
            if order == "exception" and start >= 2:
                raise RuntimeError("the trainer's own error, mid-run")
            opt.step()
            opt.zero_grad()
    finally:
        if order == "exception":
            dist.destroy_process_group()
    if order == "close_destroy":
        rec.close()
        dist.destroy_process_group()
    elif order == "destroy_close":
        dist.destroy_process_group()
        rec.close()
    elif order == "destroy_only":
        dist.destroy_process_group()
    elif order == "early_destroy":
        early()
        rec.close()
    # "exit": nothing; the interpreter's exit ends the recorder and the group


def start_rank(order, rank, ranks, port, out, log):
    """Forks rank `rank`: the child runs the trainer and then leaves
    through the interpreter's own exit (SystemExit, or the trainer's
    exception, unwinds to the top: atexit handlers and the teardown of
    every module run as in a script); the parent has imported torch, so a
    rank costs no import."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank))
    from accumcheck_torch import exit_on_refusal
    exit_on_refusal(rank_main, order, out)  # a refused rank exits 2, as a script does
    raise SystemExit(0)


def one_run(order, ranks, out, timeout, accumcheck):
    """'ok', 'hang' or 'fail: why' for one run of the order, and the
    ranks' output."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out + ".logs", exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = [os.path.join(out + ".logs", "rank%d.txt" % r) for r in range(ranks)]
    pids = [start_rank(order, r, ranks, port, out, logs[r]) for r in range(ranks)]
    end = time.monotonic() + timeout
    codes = {}
    while len(codes) < ranks and time.monotonic() < end:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    hung = len(codes) < ranks
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    outputs = [open(f).read() for f in logs]
    if hung:
        return "hang", outputs
    want = {"exception": 1, "early_destroy": 2}.get(order, 0)
    got = [codes[p] for p in pids]
    if any(c != want for c in got):
        return "fail: exit codes %s, expected %d" % (got, want), outputs
    c = subprocess.run([accumcheck, "certify", "--contract", "--trace", out],
                       capture_output=True, text=True)
    if order in UNFINISHED:
        if os.path.exists(os.path.join(out, "complete.csv")):
            return "fail: a trace was written by a run that did not finish", outputs
        if order == "early_destroy" and not all(REFUSED in o for o in outputs):
            return "fail: a rank did not say %r" % REFUSED, outputs
        if c.returncode != 2 or UNFINISHED[order] not in c.stderr:
            return "fail: certify exited %d, expected 2 naming %r" % (
                c.returncode, UNFINISHED[order]), outputs + [c.stdout + c.stderr]
        return "ok", outputs
    if c.returncode != 0:
        return "fail: certify exited %d" % c.returncode, outputs + [c.stdout + c.stderr]
    return "ok", outputs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--work", default="ddp_close")
    ap.add_argument("--accumcheck", default="accumcheck")
    a = ap.parse_args()
    # Once, before the ranks fork.
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data  # noqa: F401

    import accumcheck_torch.distributed  # noqa: F401
    # What this process holds (torch's heap) out of the collector's reach:
    # a rank's exit collects garbage before it tears down the modules, and
    # a collection over torch's whole heap writes every object's header,
    # copying each page from this process (about 1 s of CPU a rank).  The
    # rank's own objects (its process group, model, recorder) are made
    # after the fork and collected as before.
    gc.freeze()
    bad = 0
    t0 = time.monotonic()
    cpu0 = os.times()
    for order in a.orders.split(","):
        hangs, fails = 0, 0
        for i in range(a.runs):
            what, outputs = one_run(order, a.ranks, os.path.join(a.work, order), a.timeout,
                                    a.accumcheck)
            if what != "ok":
                hangs += what == "hang"
                fails += what != "hang"
                print("%s run %d: %s" % (order, i, what))
                for o in outputs:
                    sys.stdout.write(o[-2000:])
        print("%s: %d runs of %d ranks, %d hangs, %d failures" % (order, a.runs, a.ranks,
                                                                  hangs, fails))
        bad += hangs + fails
    cpu = os.times()
    print("wall %.1f s, CPU %.1f s (children)" % (
        time.monotonic() - t0, cpu.children_user + cpu.children_system
        - cpu0.children_user - cpu0.children_system))
    if bad == 0:
        print("driver: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
