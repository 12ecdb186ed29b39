"""The accumcheck trace schema, as verify/trace.cpp writes and reads it.

verify/trace.* is the one reader and writer of record; this module only
writes what it reads: meta.csv, events.csv, values.csv, each atomically.
"""

import csv
import math
import os
import sys
import tempfile

TRACE_SCHEMA = "accumcheck-trace/2"
EVENTS_HEADER = "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,sample_ids"
VALUES_HEADER = "run,step,kind,tensor,index,value"
VERSION = "0.2.0"


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


def write_atomically(path, text):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp.")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_trace(folder, meta, events, values, extra=None, ranks=False):
    """meta: [(key, value)]; events, values: row strings ending in '\\n';
    extra: {file name: text} (the contract tier's contract.csv); ranks:
    the rows end in the `rank` column (a multi-rank trace).
    Writes events, values and extra first and meta last (a trace without
    meta.csv is incomplete and refused by the reader)."""
    os.makedirs(folder, exist_ok=True)
    for name, text in sorted((extra or {}).items()):
        write_atomically(os.path.join(folder, name), text)
    rank = ",rank" if ranks else ""
    write_atomically(os.path.join(folder, "events.csv"),
                     EVENTS_HEADER + rank + "\n" + "".join(events))
    write_atomically(os.path.join(folder, "values.csv"),
                     VALUES_HEADER + rank + "\n" + "".join(values))
    write_atomically(os.path.join(folder, "meta.csv"),
                     "key,value\n" + "".join("%s,%s\n" % (k, _field(v)) for k, v in meta))


def _field(v):
    v = str(v)
    if "," in v or '"' in v or "\n" in v:
        return '"' + v.replace('"', '""').replace("\n", " ") + '"'
    return v
