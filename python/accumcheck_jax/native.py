"""accumcheck_jax's native tap (native_tap.cc): the output path's tap as
an XLA FFI call on jax's CPU backend instead of a host callback, so that
your gradient program keeps jax's asynchronous dispatch (a program with
a Python callback runs synchronously in the dispatching thread, and that
alone cost a decoder 16-19% of its peak memory: docs/frameworks-jax-
keras.md).

The handler is built the first time a recorder needs it, with your C++
compiler ($CXX, else c++) against jaxlib's own FFI headers
(jax.ffi.include_dir()), into a cache ($ACCUMCHECK_CACHE_DIR, else
$XDG_CACHE_HOME/accumcheck, else ~/.cache/accumcheck) keyed by the
source, the headers and the compiler: about 2 s, once.  Where it cannot
be built or loaded (no compiler, no jax.ffi), or ACCUMCHECK_JAX_TAP=callback
is set, the tap stays a host callback and the recorder says so in
meta.csv; the verdict is the same either way."""

import ctypes
import hashlib
import itertools
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

TARGET = "accumcheck_tap"
_SOURCE = Path(__file__).with_name("native_tap.cc")
_lock = threading.Lock()
_loaded = None   # (library, None) or (None, why not): decided once a process
_channels = itertools.count(1)
_sites = itertools.count(1)


def _cache_dir():
    own = os.environ.get("ACCUMCHECK_CACHE_DIR")
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accumcheck"


def _build(jax):
    """The handler's library, built into the cache if it is not there:
    its path, or raises OSError / RuntimeError saying why not."""
    include = Path(jax.ffi.include_dir())
    cxx = os.environ.get("CXX") or "c++"
    key = hashlib.sha256()
    key.update(_SOURCE.read_bytes())
    for header in sorted((include / "xla" / "ffi" / "api").glob("*.h")):
        key.update(header.name.encode() + b"\0" + header.read_bytes())
    key.update(cxx.encode())
    cache = _cache_dir()
    path = cache / ("jax-tap-%s.so" % key.hexdigest()[:20])
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".jax-tap-", suffix=".so", dir=str(cache))
    os.close(fd)
    try:
        done = subprocess.run([cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-isystem", str(include),
                               str(_SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
            raise RuntimeError("%s could not build it: %s" % (cxx, last))
        os.replace(tmp, path)  # atomic: a process beside this one sees all of it or nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def library(jax):
    """(the loaded handler library, None), or (None, why the tap stays a
    host callback).  Built, loaded and registered with XLA once a process."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        if os.environ.get("ACCUMCHECK_JAX_TAP", "") == "callback":
            _loaded = (None, "ACCUMCHECK_JAX_TAP=callback")
            return _loaded
        ffi = getattr(jax, "ffi", None)
        if ffi is None or not all(hasattr(ffi, f) for f in ("include_dir", "ffi_call",
                                                           "register_ffi_target", "pycapsule")):
            _loaded = (None, "this jax has no jax.ffi")
            return _loaded
        try:
            lib = ctypes.CDLL(str(_build(jax)))
            i64, p = ctypes.c_int64, ctypes.c_void_p
            for name, res, args in (("accumcheck_tap_open", None, [i64]),
                                    ("accumcheck_tap_mute", None, [i64]),
                                    ("accumcheck_tap_close", None, [i64]),
                                    ("accumcheck_tap_bytes", i64, [i64]),
                                    ("accumcheck_tap_front", i64, [i64, ctypes.POINTER(i64)]),
                                    ("accumcheck_tap_pop", ctypes.c_int, [i64, p, i64])):
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            ffi.register_ffi_target(TARGET, ffi.pycapsule(lib.AccumcheckTap), platform="cpu")
            _loaded = (lib, None)
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError, ValueError) as e:
            _loaded = (None, "the native tap could not be built or loaded (%s)" % e)
        return _loaded


class Channel:
    """A recorder's queue in the handler: the taps of its traced backwards
    (a site each: the layout of its operands), in the order your programs
    ran them."""

    def __init__(self, jax, lib):
        self.jax, self.lib = jax, lib
        self.id = next(_channels)
        self.layouts = {}    # site -> [(shape, numpy dtype)] of its operands
        self.handlers = {}   # site -> the function told() hands them to
        self.sites = {}      # (layout, handler) -> a side effect's site (zero())
        self.open = True
        lib.accumcheck_tap_open(self.id)

    def zero(self, dtype, operands, effect=False, handler=None):
        """The FFI call: the tap of these operands, returning dtype's zero.
        effect: declared a side effect (jax.effects_barrier() then waits
        for the program that holds it); handler: what pull() hands this
        site's operands to (told())."""
        jax = self.jax
        layout = [(tuple(x.shape), np.dtype(x.dtype)) for x in operands]
        # A side effect's site is one for each layout and handler, not each
        # trace: a site is an attribute of the call, so a new one each call
        # had jax compile the call anew wherever it ran outside jit (an
        # optimizer update called eagerly: a compilation every step,
        # measured).  A call without side effect keeps a site of its own:
        # XLA would merge two such calls of the same attributes and operands
        # (a forward run twice), and the recorder counts them.
        key = (tuple(layout), handler) if effect else None
        site = self.sites.get(key) if effect else None
        if site is None:
            site = next(_sites)
            self.layouts[site] = layout
            self.handlers[site] = handler
            if effect:
                self.sites[key] = site
        call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((), dtype), has_side_effect=effect)
        return call(*operands, channel=np.int64(self.id), site=np.int64(site))

    def told(self):
        """Every queued tap handed to its site's handler, oldest first."""
        for site, arrays in self.pull():
            self.handlers[site](*arrays)

    def held(self):
        """The bytes queued, not yet pulled."""
        return int(self.lib.accumcheck_tap_bytes(self.id)) if self.open else 0

    def pull(self):
        """Every queued tap, oldest first, each (its site, its operands as
        numpy arrays)."""
        out = []
        site = ctypes.c_int64(0)
        while self.open:
            size = int(self.lib.accumcheck_tap_front(self.id, ctypes.byref(site)))
            if size < 0:
                break
            raw = np.empty(size, np.uint8)
            if self.lib.accumcheck_tap_pop(self.id, raw.ctypes.data, size) != 0:
                raise RuntimeError("the native tap's queue changed while it was read")
            layout = self.layouts[site.value]
            arrays, at = [], 0
            for shape, dtype in layout:
                n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                part = raw[at:at + n]
                if part.ctypes.data % dtype.alignment:  # an operand after one of an odd size
                    part = part.copy()
                arrays.append(part.view(dtype).reshape(shape))
                at += n
            if at != size:
                raise RuntimeError("a tap of %d bytes, its layout %d" % (size, at))
            out.append((site.value, tuple(arrays)))
        return out

    def mute(self):
        """Taps dropped from now on (the call writes its zero alone)."""
        if self.open:
            self.lib.accumcheck_tap_mute(self.id)

    def close(self):
        if self.open:
            self.open = False
            self.lib.accumcheck_tap_close(self.id)
