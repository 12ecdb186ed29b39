"""What accumcheck_jax's recorder takes from the programs: the kept
coordinates of each parameter leaf (a fixed seeded sample of a large
leaf), the vectors the programs hand over (packed, one transfer each) and
the host callbacks that hand them, and the lr an optax state holds."""

import math
import sys

import numpy as np
from accumcheck_trace.trace import Refused


def _jax():
    try:
        import jax
    except ImportError as e:  # pragma: no cover - the venv has it
        raise Refused("accumcheck_jax needs jax: bash scripts/venv-jax.sh makes .venv-jax/ (%s)" % e)
    return jax


def _enable_x64(jax):
    """jax's float64 scope (jax.enable_x64 from 0.5 on, else the
    experimental one): only the recorder's calibration runs inside it."""
    scope = getattr(jax, "enable_x64", None)
    if scope is not None:
        return scope(True)
    from jax.experimental import enable_x64
    return enable_x64()


def _is_nnx(obj):
    """obj is a Flax NNX module (flax.nnx never imported here: a run that
    has not imported it has none, and its import costs half a second)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(obj, nnx.Module)


class _Leaves:
    """The parameters' layout: which coordinates of each leaf are kept."""

    def __init__(self, shapes, coordinates, seed):
        self.picks, self.sizes = [], []
        for i, shape in enumerate(shapes):
            size = int(np.prod(shape)) if len(shape) else 1
            self.sizes.append(size)
            if size <= coordinates:
                self.picks.append(None)
            else:
                rng = np.random.default_rng([seed, i, size])
                self.picks.append(np.sort(rng.choice(size, coordinates, replace=False)))
        self.d = sum(s if p is None else len(p) for s, p in zip(self.sizes, self.picks))
        self.on_device = None

    def take(self, jnp, leaves):
        """In the program: the kept coordinates of each leaf.  The indices
        are device arrays, made once: a numpy constant would be copied to
        the device at every call of the program."""
        if self.on_device is None:
            import jax
            with jax.ensure_compile_time_eval():  # concrete, though made while tracing
                self.on_device = [None if p is None else jax.device_put(p.astype(np.int32))
                                  for p in self.picks]
        out = []
        for leaf, pick in zip(leaves, self.on_device):
            flat = jnp.reshape(leaf, (-1,))
            out.append(flat if pick is None else jnp.take(flat, pick))
        return out

    def host(self, leaves):
        """On the host, from whole leaves: the kept coordinates as one
        float64 vector, each leaf's written into its place (no part
        copied twice: a decoder's 52 leaves cost 0.6 ms a call so)."""
        out = np.empty(sum(np.size(x) if p is None else len(p) for x, p in zip(leaves, self.picks)))
        at = 0
        for leaf, pick in zip(leaves, self.picks):
            flat = np.asarray(leaf).reshape(-1)
            n = flat.size if pick is None else len(pick)
            out[at:at + n] = flat if pick is None else flat[pick]
            at += n
        return out


def join(taken):
    """What take() kept (a callback's arguments) as one float64 vector."""
    return np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in taken]) \
        if len(taken) else np.zeros(0)


# The compiler options _jit_rare tries by default, in order: XLA's backend
# optimisation level 0 with its loop emitters instead of its MLIR fusion
# emitters, then level 0 alone (a jaxlib without the emitters' option).
# Their compilation, not their run, is what the recorder's rare programs
# cost a short run (measured on the wide MLP, 512-4096-4, CPU time of the
# first call, least of 3 at load 7.6: the float64 gradient 0.10 s against
# 0.24 s at level 0 alone, each later call 9.9 ms against 7.9 ms; s_j's
# program 0.05 s against 0.08 s).
RARE = ({"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False},
        {"xla_backend_optimization_level": 0})


def _jit_rare(jax, fn, options=RARE):
    """jax.jit(fn) for a program of the recorder's that is compiled in the
    run it records and then runs rarely or on little (the premise check's
    float32 gradient and the calibration's float64 one, s_j at small
    outputs (outputs._S_FULL_AT), Keras's per-step program): on the CPU
    backend compiled with the first of `options` this jaxlib knows (an
    unknown option fails the first call's compilation: the next is tried,
    then plain jax.jit); plain jax.jit on an accelerator or a jax without
    compiler_options (0.4.30).  With RARE a 2.1M-parameter MLP's float64
    gradient compiles and runs once in 0.10 s of CPU against 0.24 s at
    level 0 alone, and runs 2 ms slower a call (measured: RARE above).
    Only the recorder's numbers can change (by rounding), never your
    run's."""
    if jax.default_backend() != "cpu":
        return jax.jit(fn)
    try:
        tries = [jax.jit(fn, compiler_options=o) for o in options]
    except TypeError:
        return jax.jit(fn)
    tries.append(jax.jit(fn))
    chosen = []

    def call(*args):
        if chosen:
            return chosen[0](*args)
        for i, f in enumerate(tries):
            try:
                out = f(*args)
            except Exception as e:  # noqa: BLE001
                if i + 1 < len(tries) and "compile option" in str(e):
                    continue
                raise
            chosen.append(f)
            return out
    return call


def dot(a, b, out=None):
    """a . b of two float64 vectors, summed by numpy (pairwise), not by the
    BLAS: OpenBLAS's ddot runs on threads past 10000 elements, and their
    wake-up and spin cost a recorder's d-vector (d ~ 12000) about 10 ms of
    CPU time a call on a loaded machine (measured), 3 us alone.  out: a
    float64 buffer of a's length for the products (the same sum, without
    a fresh vector: the callers that loop over many rows)."""
    return float(np.sum(np.multiply(a, b, out=out)))


def norm(a, out=None):
    """|a| (as dot)."""
    return math.sqrt(dot(a, a, out))


def lstsq(A, b, overwrite=False):
    """np.linalg.lstsq(A.T, b, rcond=None)'s solution (the least-squares
    fit of b over the rows of A, m x d, m small; the minimal-norm one where
    they are dependent), without the BLAS on the long dimension: a
    Householder QR of A.T summed by numpy (as dot), then LAPACK on the m x m
    triangle alone.  A.T = Q R with Q's columns orthonormal, so R has A.T's
    singular values and the fit over R of Q^T b is the fit over A.T of b:
    the same solution, with lstsq's cutoff for A.T (eps * max(d, m) of the
    largest singular value).  OpenBLAS's least squares of a 12292 x 17
    problem (K = 16) runs on threads whose wait cost 16-46 ms of CPU a
    call in the run (measured on the wide MLP at load 5), 4.7 ms alone;
    this one 4.5 ms (1 ms at K = 4), on the main thread alone (a
    GPT-style decoder's 80,640 coordinates: 2.5 ms at K = 4, 17 ms at
    K = 16).  Against
    lstsq's: the same coefficients to 1e-14 relative on independent rows,
    to the problem's conditioning (2e-6 at a condition number near 1e9) on
    nearly dependent ones, the residual the same to 7 digits.  overwrite:
    A may be reflected in place (its contents lost), not copied."""
    m, d = A.shape
    # Reflected in place (W[j, k:] is column j's rows k..): A itself where
    # the caller gives it up (overwrite, a float64 C-contiguous A).
    W = A if overwrite and A.dtype == np.float64 and A.flags.c_contiguous and A.flags.writeable \
        else np.array(A, dtype=np.float64)
    y = np.array(b, dtype=np.float64)
    R = np.zeros((m, m))
    tmp = np.empty(d)
    for k in range(min(m, d)):
        x = W[k, k:]
        nx = norm(x)
        if nx == 0:
            continue
        alpha = -nx if x[0] >= 0 else nx
        v = x.copy()
        v[0] -= alpha
        nv = norm(v)
        if nv > 0:
            v /= nv
            # Each row (and y) reflected in turn through one row-sized
            # buffer: the same sums and products as reflecting the block
            # at once, bit for bit, without its two block-sized
            # temporaries (2.7x faster on a decoder's 5 x 80640).
            t = tmp[:d - k]
            for row in list(W[k:, k:]) + [y[k:]]:
                row -= np.multiply(v, 2.0 * dot(row, v, t), out=t)
        R[k, k:] = W[k:, k]
    cut = np.finfo(np.float64).eps * max(m, d)
    sol, *_ = np.linalg.lstsq(R, y[:m], rcond=cut)
    return sol


def _pack(jnp, leaves):
    """Leaves as one flat vector (float32, or float64 if any leaf is
    wider): exact for float32, bfloat16, float16 and small integers."""
    wide = any(jnp.dtype(x.dtype).itemsize > 4 for x in leaves)
    dt = jnp.float64 if wide else jnp.float32
    return jnp.concatenate([jnp.reshape(x, (-1,)).astype(dt) for x in leaves]) if leaves \
        else jnp.zeros(0, dt)


def _unpack(flat, shapes):
    """_pack's leaves again, each in its own shape and dtype."""
    out, at = [], 0
    flat = np.asarray(flat)
    for shape, dtype in shapes:
        n = int(np.prod(shape)) if len(shape) else 1
        out.append(flat[at:at + n].reshape(shape).astype(dtype))
        at += n
    return out


def _host_call(jax, fn, *args, ordered=True):
    """fn(*args) on the host with numpy arrays, in program order (an
    ordered io_callback: jax.debug.callback would put every argument back
    on the device first, which cost 3x the run on a small model)."""
    from jax.experimental import io_callback
    io_callback(fn, None, *args, ordered=ordered)


def _told(jax, fn, state, *args, channel=None):
    """fn(*args) on the host, in the program that makes `state` (an optax
    state): a jax.pure_callback whose result, an integer zero, is added to
    the state's first integer leaf (its step count: exact), so that it
    runs exactly when the state is made.  Cheaper than an ordered
    io_callback (measured: 0.95 ms a call of a small model's optimizer
    step, 0.08 ms without; 0.28 ms with this), though a program with any
    host callback leaves jax's C++ dispatch path (jax 0.10.2's
    pxla.create_cpp_call: 1.8-3.1 ms a call on a 1M decoder's step,
    about 200 arrays in and out).  It runs
    before the parameters that program makes are ready (the recorder
    waits for them).  A state with no integer leaf: an ordered
    io_callback.

    channel (a native.Channel, jax's CPU backend): an FFI call instead,
    declared a side effect, whose operands fn takes when the recorder
    pulls them (channel.told(), after jax.effects_barrier()): no Python
    callback in the program, so jax runs it asynchronously on its worker
    threads like any other (a callback's program runs synchronously in the
    dispatching thread; measured: 130 MB of a 10M decoder's recorded peak)."""
    leaves, treedef = jax.tree_util.tree_flatten(state)
    at = next((i for i, x in enumerate(leaves)
               if hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.numpy.integer)), None)
    if at is None:
        _host_call(jax, fn, *args)
        return state
    dtype = leaves[at].dtype
    if channel is not None:
        args = [jax.numpy.asarray(a) for a in args]
        leaves[at] = leaves[at] + channel.zero(dtype, args, effect=True, handler=fn)
        return jax.tree_util.tree_unflatten(treedef, leaves)
    leaves[at] = leaves[at] + jax.pure_callback(_Told(fn, dtype), jax.ShapeDtypeStruct((), dtype),
                                                *args)
    return jax.tree_util.tree_unflatten(treedef, leaves)


class _Told:
    """_told's callback: fn(*args), then the dtype's zero.  Equal to another
    of the same fn and dtype (jax compares a callback's function when it
    caches the program that holds it: a new function at each call had an
    optimizer update called outside jit compiled anew every step)."""

    def __init__(self, fn, dtype):
        self.fn, self.dtype = fn, np.dtype(dtype)
        self._key = (fn, self.dtype)

    def __call__(self, *a):
        self.fn(*a)
        return np.zeros((), self.dtype)

    def __eq__(self, other):
        return isinstance(other, _Told) and self._key == other._key

    def __hash__(self):
        return hash(self._key)


def _lr_of(state):
    """The lr an optax state says its update used: optax.inject_hyperparams'
    hyperparams (found anywhere in the state tree), else None."""
    seen = [state]
    while seen:
        s = seen.pop()
        hp = getattr(s, "hyperparams", None)
        if isinstance(hp, dict) and "learning_rate" in hp:
            return hp["learning_rate"]
        if isinstance(s, (tuple, list)):
            seen.extend(s)
        elif hasattr(s, "_fields"):
            seen.extend(getattr(s, f) for f in s._fields)
    return None
