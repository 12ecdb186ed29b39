"""Both recorders' hand-back of the C heap's free pages (glibc's
malloc_trim), before each micro-batch's forward: the recorder's small
allocations that outlive a micro-batch sit between the large temporaries
your forward and backward free, so glibc cannot shrink its heap and keeps
those pages, which count in the run's peak."""

import ctypes

_TRIM = []  # [(malloc_trim, mallinfo2) or None], looked up once

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
    HEAP_TRIM_FREE_BYTES free.  The run's numbers are untouched
    (bit-identical): only pages no allocation holds are handed back.

    Measured: accumcheck_torch at 10M parameters and K = 64, 55 MB of free
    heap held beyond the plain run's (mallinfo2 fordblks), a peak of 668
    against 583 MB plain; trimmed before each forward, 624 MB.
    accumcheck_jax's decoder at 10M: docs/frameworks-jax-keras.md."""
    if not _TRIM:
        _TRIM.append(_glibc())
    if _TRIM[0] is not None:
        trim, info = _TRIM[0]
        if info().fordblks >= HEAP_TRIM_FREE_BYTES:
            trim(0)
