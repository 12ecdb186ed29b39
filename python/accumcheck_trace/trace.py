"""The accumcheck trace schema, as verify/trace/ writes and reads it: the
one trace writer of every recorder (accumcheck_torch, accumcheck_jax), free
of any framework (numpy only, imported where values are written).

verify/trace/ is the one reader and writer of record; this module only
writes what it reads: meta.csv, events.csv and the values (values.bin,
or values.csv), each atomically, then the completion record complete.csv
last (every file's rows, bytes and SHA-256: verify/trace/trace.hpp).
values.bin (verify/trace/trace.hpp gives the format) is written only here:
class Values.

Every recorder's life in its trace folder is a Recording (below): a marker
from its start until the trace is written and sealed, saying how far the
run got and how it ended when it did not end by close() (an exception, a
refusal, a signal, the interpreter's exit); certify refuses a folder that
holds one (exit 2), naming what happened.  The recorders only say when
they start, step and end: what a run that did not finish leaves is
decided here.
"""

import atexit
import csv
import hashlib
import math
import os
import signal
import struct
import sys
import tempfile
import threading

from ._version import __version__ as VERSION  # noqa: F401  (re-exported)

TRACE_SCHEMA = "accumcheck-trace/2"
EVENTS_HEADER = "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,sample_ids"
VALUES_HEADER = "run,step,kind,tensor,index,value"

VALUES_MAGIC = b"ACVALUES"
VALUES_VERSION = 2
# values.bin block kinds: a step's gradient or parameters, and (version 2)
# the per-element training state that state.csv would otherwise hold.
BLOCK_KINDS = {"grad": 0, "param": 1, "exp_avg": 2, "exp_avg_sq": 3, "ema": 4}


class Refused(Exception):
    """Input accumcheck cannot work with: an ordinary exception, which a
    caller may catch (`except Exception` does).  A recorder that refuses
    once it records ends there, its marker saying so (no trace of the run
    is written, whatever the script does next).  The command-line paths
    (the examples, `python -m` entry points: exit_on_refusal) print the
    message and exit 2, like the C++ tool; the pytest plugin fails the test
    with it.  `code` is that exit code."""

    code = 2

    def __init__(self, message):
        super().__init__(message)
        self.message = message

    def __str__(self):
        return self.message


def exit_on_refusal_as(program):
    """exit_on_refusal for the package named `program` (its messages'
    prefix): main(*args, **kwargs) as a command line runs it: a Refused ends
    the process with exit code 2 and its message on stderr (no traceback),
    as the C++ tool's bad input does.  The examples' `__main__` blocks."""
    def exit_on_refusal(main, *args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Refused as e:
            sys.stderr.write("%s: %s\n" % (program, e.message))
            sys.stderr.flush()
            raise SystemExit(2) from None
    return exit_on_refusal


def unseen_meta(unseen):
    """meta.csv's `unseen` row for what a recorder could not see (certify
    refuses to FAIL such a trace: exit 2), the first three and a count."""
    if not unseen:
        return []
    shown = unseen[:3] + (["... (%d in all)" % len(unseen)] if len(unseen) > 3 else [])
    return [("unseen", " | ".join(shown))]


def real(x):
    """17 significant digits (exact for float32 and float64); NaN is ''."""
    x = float(x)
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "%.17g" % x


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class Written:
    """What write_atomically wrote: its size, SHA-256 (hex) and line
    count (None for bytes chunks)."""

    def __init__(self, size, sha256, lines):
        self.size, self.sha256, self.lines = size, sha256, lines


def write_atomically(path, text, fsync=True):
    """text: a str, or an iterable of bytes chunks (written in order);
    fsync=False for a file rewritten often (a rank's marker).  Returns a
    Written (its digest computed as it is written, not read back)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp.")
    digest, size, lines = hashlib.sha256(), 0, None
    try:
        binary = not isinstance(text, str)
        with os.fdopen(fd, "wb") as f:
            if binary:
                for chunk in text:
                    f.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            else:
                data = text.encode("utf-8")
                f.write(data)
                digest.update(data)
                size, lines = len(data), data.count(b"\n")
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return Written(size, digest.hexdigest(), lines)


class Values:
    """A trace's values, kept until write_trace: values.bin (binary=True)
    or values.csv rows.

    tensors: [(name, elements)] in the scenario's layout order; width: 4
    (float32) or 8 (float64), the bytes per value of values.bin.  add()
    takes one block: a run's gradient (kind "grad") or parameters ("param")
    of one step, one flat array per tensor (anything numpy.asarray takes);
    values.bin also takes the state kinds exp_avg, exp_avg_sq (step: the
    optimizer step) and ema (step: the EMA update's number), in the
    parameters' layout (add_state tells whether it can)."""

    def __init__(self, tensors, width=4, binary=True):
        if width not in (4, 8):
            raise ValueError("values.bin holds 4- or 8-byte values, not %r" % width)
        self.tensors = [(str(n), int(k)) for n, k in tensors]
        self.width, self.binary = width, binary
        self.rows = []      # values.csv rows
        self.chunks = []    # values.bin: header, then the blocks
        if binary:
            head = [VALUES_MAGIC, struct.pack("<III", VALUES_VERSION, width, len(self.tensors))]
            for name, k in self.tensors:
                b = name.encode("utf-8")
                head.append(struct.pack("<I", len(b)) + b + struct.pack("<Q", k))
            self.chunks.append(b"".join(head))

    def add(self, run, step, kind, arrays, rank=0):
        import numpy
        if kind not in BLOCK_KINDS or (kind not in ("grad", "param") and not self.binary):
            raise ValueError("kind %r: expected grad or param%s" % (
                kind, ", exp_avg, exp_avg_sq or ema" if self.binary else ""))
        if len(arrays) != len(self.tensors):
            raise ValueError("%d arrays for %d tensors" % (len(arrays), len(self.tensors)))
        flats = [numpy.asarray(a).reshape(-1) for a in arrays]
        for (name, k), a in zip(self.tensors, flats):
            if a.size != k:
                raise ValueError("tensor %s: %d values, expected %d" % (name, a.size, k))
        if not self.binary:
            for (name, _), a in zip(self.tensors, flats):
                prefix = "%s,%d,%s,%s," % (run, step, kind, name)
                self.rows.extend("%s%d,%s\n" % (prefix, i, real(v))
                                 for i, v in enumerate(a.astype("<f8").tolist()))
            return
        r = run.encode("utf-8")
        self.chunks.append(struct.pack("<I", len(r)) + r +
                           struct.pack("<qqI", step, rank, BLOCK_KINDS[kind]))
        dtype = "<f4" if self.width == 4 else "<f8"
        self.chunks.extend(a.astype(dtype, copy=False).tobytes() for a in flats)


    def add_state(self, run, step, kind, tensors):
        """A block of per-element state (exp_avg, exp_avg_sq, ema) when this
        is values.bin and `tensors` (arrays or tensors of any framework that
        numpy can read, None where a parameter has none) match the layout;
        False otherwise (the caller writes state.csv rows instead)."""
        flats = [None if t is None else _host(t) for t in tensors]
        if not self.binary or any(a is None or a.size != k
                                  for a, (_, k) in zip(flats, self.tensors)):
            return False
        self.add(run, step, kind, flats)
        return True


def _host(t):
    """A tensor or array as a flat numpy array on the host (a torch tensor
    detached and moved to the CPU first)."""
    import numpy
    if hasattr(t, "detach"):
        t = t.detach().cpu()
    return numpy.asarray(t).reshape(-1)


# A declared lr schedule's keys (a scenario's [schedule] table; warmup_ratio:
# the ratio a warmup was taken of the horizon with, beside the warmup it gave).
SCHEDULE_KEYS = ("kind", "warmup", "total", "step_size", "gamma", "frequency", "warmup_ratio")
# contract.csv's header (verify/trace/trace.hpp gives the rows).
CONTRACT_HEADER = "kind,index,ref,epoch,version,items,samples,value,residual,scale"


def contract_meta(engine, precision, tool_version, accumulation, items, parameters, lr,
                  schedule=None, clip=None, accept=(), lr_precision=None):
    """meta.csv's rows every contract-tier recorder writes
    (docs/trace-format.md "What any contract recorder writes"), as
    [(key, value)], in the order certify's readers expect none of: the
    schema and tier, what the recorder is, K, the items counted, the
    coordinates the fits use, the declared lr and schedule, the accepted
    clip, the accepted semantics and the lr's precision."""
    fixed = {"schema": TRACE_SCHEMA, "scenario": "contract", "scenario_digest": "contract",
             "engine": engine, "precision": precision, "tool_version": tool_version,
             "tier": "contract", "accumulation": str(int(accumulation)), "items": items,
             "parameters": str(int(parameters)), "lr": real(lr)}
    rows = list(fixed.items())
    rows.extend(("schedule_" + k, str(v)) for k, v in sorted(
        (schedule or {}).items(), key=lambda kv: SCHEDULE_KEYS.index(kv[0])))
    optional = (("clip", None if clip is None else real(clip)),
                ("accept", "+".join(accept) if accept else None),
                ("lr_precision", lr_precision))
    rows.extend((k, v) for k, v in optional if v is not None)
    return rows


def contract_event_rows(run, events, epoch_of):
    """events.csv's rows of a contract-tier recorder: events, (kind, step,
    micro (-1: a window-level call), lr or None) in call order;
    epoch_of(micro): that micro-batch's epoch.  A window-level event is in
    the epoch of the micro-batch backwarded last."""
    rows, epoch = [], 0
    for kind, step, micro, lr in events:
        epoch = epoch_of(micro) if micro >= 0 else epoch
        rows.append("%s,%d,%d,%d,%s,0,0,,%s,,\n" % (run, epoch, step, micro, kind,
                                                   "" if lr is None else real(lr)))
    return rows


# The files of a trace (verify/trace/trace.hpp kTraceFiles) and its
# completion record, written last.
TRACE_FILES = ("meta.csv", "events.csv", "values.csv", "values.bin", "state.csv",
               "contract.csv", "schedule.csv")
COMPLETE_FILE = "complete.csv"
COMPLETE_HEADER = "file,rows,bytes,sha256"


def complete_csv(written):
    """complete.csv's text: written, [(file name, Written)] in the order
    written; rows: a CSV file's lines after its header ('' for values.bin)."""
    rows = ["%s,%s,%d,%s\n" % (name, "" if not name.endswith(".csv") else max(w.lines - 1, 0),
                               w.size, w.sha256) for name, w in written]
    return COMPLETE_HEADER + "\n" + "".join(rows) + "%s,%d,,\n" % (COMPLETE_FILE, len(written))


def seal_trace(folder):
    """Writes folder/complete.csv for the trace files the folder holds now:
    for a trainer that writes a trace's files itself (call it once the run
    has finished and every file is written), and for tests that edit a
    trace to reach certify's later checks.  The recorders seal their
    traces themselves (write_trace)."""
    written = []
    for name in TRACE_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        digest, size, lines = hashlib.sha256(), 0, 0
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
                lines += chunk.count(b"\n")
        written.append((name, Written(size, digest.hexdigest(), lines)))
    write_atomically(os.path.join(folder, COMPLETE_FILE), complete_csv(written))


def write_trace(folder, meta, events, values, extra=None, ranks=False):
    """meta: [(key, value)]; events: row strings ending in '\\n'; values:
    a Values, or values.csv row strings; extra: {file name: text} (the
    contract tier's contract.csv); ranks: the CSV rows end in the `rank`
    column (a multi-rank trace).  An earlier trace's complete.csv goes
    first; then extra, events, values and meta are written, a trace file
    left from an earlier write and not written now is removed, and the
    completion record complete.csv is written last (every file's rows,
    bytes and SHA-256): a trace whose writing stopped half-way has none
    and is refused.  Then the folder's rank markers go: the run finished."""
    os.makedirs(folder, exist_ok=True)
    complete = os.path.join(folder, COMPLETE_FILE)
    if os.path.exists(complete):
        os.unlink(complete)
    written = []
    for name, text in sorted((extra or {}).items()):
        written.append((name, write_atomically(os.path.join(folder, name), text)))
    rank = ",rank" if ranks else ""
    written.append(("events.csv", write_atomically(os.path.join(folder, "events.csv"),
                                                   EVENTS_HEADER + rank + "\n" + "".join(events))))
    binary = isinstance(values, Values) and values.binary
    rows = values.rows if isinstance(values, Values) else values
    if binary:
        written.append(("values.bin", write_atomically(os.path.join(folder, "values.bin"),
                                                       values.chunks)))
    else:
        written.append(("values.csv", write_atomically(
            os.path.join(folder, "values.csv"), VALUES_HEADER + rank + "\n" + "".join(rows))))
    written.append(("meta.csv", write_atomically(
        os.path.join(folder, "meta.csv"),
        "key,value\n" + "".join("%s,%s\n" % (k, _field(v)) for k, v in meta))))
    names = {name for name, _ in written}
    for name in TRACE_FILES:
        stale = os.path.join(folder, name)
        if name not in names and os.path.exists(stale):
            os.unlink(stale)  # an earlier trace's (a trace holds what its run wrote)
    write_atomically(complete, complete_csv(written))
    # Every rank's part is in the trace: the markers go.
    clear_rank_markers(folder)


# A recording's marker, one per rank (verify/trace/read_meta.cpp reads
# them): DIR/rank<r>.incomplete (a one-process recorder: rank0.incomplete,
# ranks 1), written when the recorder starts and rewritten as it goes,
# removed once the trace is written and sealed (a multi-rank run: when
# rank 0 writes the merged trace; a pipeline's stage: when the stage
# writes its own trace, DIR being that stage's folder).  A folder that
# still holds one is the trace of a run that did not finish (died
# mid-run, or ended by an exception, a refusal, a signal, or the
# interpreter's exit before close()): certify refuses it (exit 2) naming
# the rank, its marker, how far it got and how it ended.
RANK_MARKER_PREFIX = "rank"
RANK_MARKER_SUFFIX = ".incomplete"


def rank_marker_path(folder, rank):
    return os.path.join(folder, "%s%d%s" % (RANK_MARKER_PREFIX, rank, RANK_MARKER_SUFFIX))


def clear_rank_markers(folder, rank=None):
    """The folder's rank markers (rank: that rank's alone) removed, once the
    trace they stand for is written (complete.csv last)."""
    for name in os.listdir(folder):
        if name.startswith(RANK_MARKER_PREFIX) and name.endswith(RANK_MARKER_SUFFIX) and (
                rank is None or os.path.join(folder, name) == rank_marker_path(folder, rank)):
            os.unlink(os.path.join(folder, name))


def write_rank_marker(folder, rank, ranks, state, steps, backward, why="", planned=None):
    """state: "recording" (the rank's recorder is live: a rank that dies
    leaves it so) or "ended" (it ended without its part in a trace: `why`);
    steps and backward: the optimizer steps and backward passes the rank
    had recorded; planned: the steps the run was to take, when known (the
    oracle tier's scenario)."""
    os.makedirs(folder, exist_ok=True)
    rows = [("rank", rank), ("ranks", ranks), ("state", state), ("steps", steps),
            ("backward", backward), ("why", why)]
    if planned is not None:
        rows.append(("planned", planned))
    write_atomically(rank_marker_path(folder, rank),
                     "key,value\n" + "".join("%s,%s\n" % (k, _field(v)) for k, v in rows),
                     fsync=False)


def stopped_by(at_exit=False):
    """How the run is ending when not normally, or None: an exception
    propagating or being handled (close() in a `finally`, an `except`, a
    `with` block's exit), or, at_exit, the one that ended the script
    (sys.last_value; read only there: pytest sets it for every failed
    test).  SystemExit(0) (sys.exit()) is a normal end."""
    e = sys.exc_info()[1]
    if at_exit and (e is None or (isinstance(e, SystemExit) and not e.code)):
        e = getattr(sys, "last_value", None)
    if e is None or (isinstance(e, SystemExit) and not e.code):
        return None
    return describe(e)


def describe(e):
    """An exception as a marker's `why`: "KeyboardInterrupt", "RuntimeError:
    its first line", "the recorder refused: the message"."""
    if isinstance(e, Refused):
        said = e.message.strip()
        return "the recorder refused" + (": " + said.splitlines()[0][:300] if said else "")
    said = str(e).strip()
    said = said.splitlines()[0][:200] if said else ""
    return type(e).__name__ + (": " + said if said else "")


# The recordings of this process not yet ended, and the signal handlers
# replaced while any lives (signal -> the handler before ours).
_LIVE_RECORDINGS = []
_SIGNALS = {}
_STOP_SIGNALS = ("SIGTERM", "SIGHUP")


class Recording:
    """One recorder's life in its trace folder: its marker (above) from
    now until the trace is written, rewritten by progress() (the steps and
    backward passes so far) and by end(why) when the run ends any other way
    than close().  While any recording lives, SIGTERM and SIGHUP (where
    their handler is the default, in the main thread) first mark every live
    recording ended by that signal, then end the process as the default
    would; the interpreter's exit ends those not ended, calling their
    on_exit (the recorder removes its hooks there and says why).  Only the
    process that made the recording writes its marker (a DataLoader worker
    forked from it inherits the handler, never the recording)."""

    def __init__(self, folder, rank=0, ranks=1, planned=None, on_exit=None):
        self.folder, self.rank, self.ranks, self.planned = folder, rank, ranks, planned
        self.on_exit = on_exit
        self.pid = os.getpid()
        self.steps = self.backward = 0
        self.live = True
        self.mark("recording")
        _LIVE_RECORDINGS.append(self)
        _catch_stop_signals()

    def mark(self, state, why=""):
        if os.getpid() == self.pid:
            write_rank_marker(self.folder, self.rank, self.ranks, state, self.steps,
                              self.backward, why, self.planned)

    def progress(self, steps, backward, write=True):
        """The steps and backward passes recorded so far (write: the marker
        rewritten now; else at the next write)."""
        self.steps, self.backward = steps, backward
        if write and self.live:
            self.mark("recording")

    def end(self, why):
        """The run ended without its trace: the marker says why."""
        if self.live:
            self.live = False
            self.mark("ended", why)
            self._forget()

    def done(self):
        """The trace is written (write_trace removed the markers)."""
        if self.live:
            self.live = False
            self._forget()

    def _forget(self):
        if self in _LIVE_RECORDINGS:
            _LIVE_RECORDINGS.remove(self)
        if not _LIVE_RECORDINGS:
            _restore_stop_signals()


def _catch_stop_signals():
    if _SIGNALS or threading.current_thread() is not threading.main_thread():
        return
    for name in _STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
            _SIGNALS[sig] = signal.signal(sig, _on_stop_signal)


def _restore_stop_signals():
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, before in list(_SIGNALS.items()):
        if signal.getsignal(sig) is _on_stop_signal:
            signal.signal(sig, before)
    _SIGNALS.clear()


def _on_stop_signal(signum, frame):
    """A stop signal: every live recording of this process ended by it,
    then the signal's default action (the process ends by the signal, as
    it would without a recorder)."""
    name = signal.Signals(signum).name
    for rec in _LIVE_RECORDINGS:
        if rec.pid == os.getpid():
            rec.end("%s: the process was stopped by a signal" % name)
    _restore_stop_signals()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


@atexit.register
def _at_exit():
    """The recordings nobody ended: their recorders end at the
    interpreter's exit (after an unhandled exception: that exception; else
    without close()), writing no trace.  Runs after the handlers the
    recorder modules registered (atexit runs in reverse order)."""
    for rec in _LIVE_RECORDINGS:
        if rec.pid != os.getpid():
            continue
        why = stopped_by(at_exit=True) or ("the interpreter exited without the recorder's close() "
                               "(call rec.close() after the loop, or use `with`)")
        try:
            if rec.on_exit is not None:
                rec.on_exit(why)
        finally:
            rec.end(why)


def _field(v):
    v = str(v)
    if "," in v or '"' in v or "\n" in v:
        return '"' + v.replace('"', '""').replace("\n", " ") + '"'
    return v
