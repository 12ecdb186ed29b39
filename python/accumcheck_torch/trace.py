"""The accumcheck trace schema, as verify/trace/ writes and reads it.

verify/trace/ is the one reader and writer of record; this module only
writes what it reads: meta.csv, events.csv and the values (values.bin,
or values.csv), each atomically.  values.bin (verify/trace/trace.hpp gives the
format) is written only here: class Values.
"""

import csv
import math
import os
import struct
import sys
import tempfile

TRACE_SCHEMA = "accumcheck-trace/2"
EVENTS_HEADER = "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,sample_ids"
VALUES_HEADER = "run,step,kind,tensor,index,value"
from ._version import __version__ as VERSION  # noqa: E402,F401  (re-exported)
VALUES_MAGIC = b"ACVALUES"
VALUES_VERSION = 2
# values.bin block kinds: a step's gradient or parameters, and (version 2)
# the per-element training state that state.csv would otherwise hold.
BLOCK_KINDS = {"grad": 0, "param": 1, "exp_avg": 2, "exp_avg_sq": 3, "ema": 4}


class Refused(SystemExit):
    """Input accumcheck cannot work with (exit code 2, like the C++ tool).

    The message is printed to stderr when raised, so a script that does
    not catch it exits 2 with a clear line and no traceback."""

    def __init__(self, message):
        super().__init__(2)
        self.message = message
        sys.stderr.write("accumcheck_torch: %s\n" % message)

    def __str__(self):
        return self.message


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


def write_atomically(path, text, fsync=True):
    """text: a str, or an iterable of bytes chunks (written in order);
    fsync=False for a file rewritten often (a rank's marker)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp.")
    try:
        binary = not isinstance(text, str)
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            if binary:
                for chunk in text:
                    f.write(chunk)
            else:
                f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
        is values.bin and `tensors` (torch tensors, None where a parameter
        has none) match the layout; False otherwise (the caller writes
        state.csv rows instead)."""
        if not self.binary or any(t is None or t.numel() != k
                                  for t, (_, k) in zip(tensors, self.tensors)):
            return False
        self.add(run, step, kind, [t.detach().reshape(-1).cpu().numpy() for t in tensors])
        return True


def write_trace(folder, meta, events, values, extra=None, ranks=False):
    """meta: [(key, value)]; events: row strings ending in '\\n'; values:
    a Values, or values.csv row strings; extra: {file name: text} (the
    contract tier's contract.csv); ranks: the CSV rows end in the `rank`
    column (a multi-rank trace).  Writes events, values and extra first
    and meta last (a trace without meta.csv is incomplete and refused by
    the reader); a values file of the other format left from an earlier
    write is removed (a trace holds one or the other)."""
    os.makedirs(folder, exist_ok=True)
    for name, text in sorted((extra or {}).items()):
        write_atomically(os.path.join(folder, name), text)
    rank = ",rank" if ranks else ""
    write_atomically(os.path.join(folder, "events.csv"),
                     EVENTS_HEADER + rank + "\n" + "".join(events))
    binary = isinstance(values, Values) and values.binary
    rows = values.rows if isinstance(values, Values) else values
    if binary:
        write_atomically(os.path.join(folder, "values.bin"), values.chunks)
    else:
        write_atomically(os.path.join(folder, "values.csv"),
                         VALUES_HEADER + rank + "\n" + "".join(rows))
    stale = os.path.join(folder, "values.csv" if binary else "values.bin")
    if os.path.exists(stale):
        os.unlink(stale)
    write_atomically(os.path.join(folder, "meta.csv"),
                     "key,value\n" + "".join("%s,%s\n" % (k, _field(v)) for k, v in meta))
    if ranks:
        # Every rank's part is in the trace: the ranks' markers go.
        clear_rank_markers(folder)


# A multi-rank recording's marker, one per rank (verify/trace/read.cpp
# reads them): DIR/rank<r>.incomplete, written when the rank's recorder
# starts and rewritten as it goes, removed when rank 0 writes the merged
# trace (a pipeline's stage: when the stage writes its own trace, DIR
# being that stage's folder).  A folder that still holds one is the trace of a run a rank did
# not finish (died mid-run, or ended by an exception): certify refuses it
# (exit 2) naming the rank, its marker and how far it got.
RANK_MARKER_PREFIX = "rank"
RANK_MARKER_SUFFIX = ".incomplete"


def rank_marker_path(folder, rank):
    return os.path.join(folder, "%s%d%s" % (RANK_MARKER_PREFIX, rank, RANK_MARKER_SUFFIX))


def clear_rank_markers(folder, rank=None):
    """The folder's rank markers (rank: that rank's alone) removed, once the
    trace they stand for is written (meta.csv last)."""
    for name in os.listdir(folder):
        if name.startswith(RANK_MARKER_PREFIX) and name.endswith(RANK_MARKER_SUFFIX) and (
                rank is None or os.path.join(folder, name) == rank_marker_path(folder, rank)):
            os.unlink(os.path.join(folder, name))


def write_rank_marker(folder, rank, ranks, state, steps, backward, why=""):
    """state: "recording" (the rank's recorder is live: a rank that dies
    leaves it so) or "ended" (it ended without its part in a trace: `why`);
    steps and backward: the optimizer steps and backward passes the rank
    had recorded."""
    os.makedirs(folder, exist_ok=True)
    rows = [("rank", rank), ("ranks", ranks), ("state", state), ("steps", steps),
            ("backward", backward), ("why", why)]
    write_atomically(rank_marker_path(folder, rank),
                     "key,value\n" + "".join("%s,%s\n" % (k, _field(v)) for k, v in rows),
                     fsync=False)


def _field(v):
    v = str(v)
    if "," in v or '"' in v or "\n" in v:
        return '"' + v.replace('"', '""').replace("\n", " ") + '"'
    return v
