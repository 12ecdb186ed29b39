"""The contract recorder's one rule for its own errors: they end the
recording, never the run it records."""

import ctypes
import functools

from .trace import Refused

_TRIM = []  # [glibc's malloc_trim or None], looked up once


def _never_raises(method):
    """A recorder method your run calls into (a hook, the loader's
    iteration, the optimizer's step): an error of the recorder's own ends
    the recording (the trace's marker says why, certify refuses it) and
    never reaches your training, which goes on untouched.  A Refused (a
    misuse the recorder names) still reaches you."""
    @functools.wraps(method)
    def run(self, *a, **k):
        if self.abandoned:
            return None
        try:
            return method(self, *a, **k)
        except Refused:
            raise
        except Exception as e:  # noqa: BLE001 -- the run must go on
            self._failed(method.__name__, e)
            return None
    return run


# heap_trim hands pages back only when glibc holds at least this much free
# heap: each page handed back costs a page fault when the heap grows into
# it again, so trimming before every forward doubled a small model's step
# (a 70k-parameter MLP: 200 steps 0.17 s of CPU, 0.38 s trimmed each
# time; CTest's trainers and PyTorch.trace.damaged took a third longer),
# while the free heap the recorder's small allocations pin at scale is
# tens of MB (10M parameters, K = 64: 109 MB against the plain run's 54).
HEAP_TRIM_FREE_BYTES = 32 << 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _glibc():
    """(malloc_trim, mallinfo2) from the C library, or None where it has
    not both (another libc: heap_trim does nothing there)."""
    try:
        libc = ctypes.CDLL(None)
        trim, info = libc.malloc_trim, libc.mallinfo2
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    info.argtypes, info.restype = [], _Mallinfo2
    return trim, info


def heap_trim():
    """Hand the C heap's free pages back to the system (glibc's
    malloc_trim(0); nothing elsewhere) when it holds at least
    HEAP_TRIM_FREE_BYTES free.  Called before each forward and each
    optimizer step: the recorder's small allocations that outlive a
    micro-batch (its rows, RNG states, hooks) sit between the large
    temporaries a forward and its backward free, so glibc cannot shrink its
    heap and keeps those pages: measured at 10M parameters and K = 64, 55 MB
    of free heap held beyond the plain run's (mallinfo2 fordblks), a peak of
    668 against 583 MB plain; trimmed before each forward, 624 MB.  The
    run's numbers are untouched (bit-identical)."""
    if not _TRIM:
        _TRIM.append(_glibc())
    if _TRIM[0] is not None:
        trim, info = _TRIM[0]
        if info().fordblks >= HEAP_TRIM_FREE_BYTES:
            trim(0)
