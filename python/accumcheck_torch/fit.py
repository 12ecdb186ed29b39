"""The contract recorder's fits (ContractRecorder's fit part): the rows of
sampled coordinates, and each optimizer step's consumed gradient fitted as
a combination of the backward passes since the previous step."""

import torch

# The error model's mirrors (oracle/error_model.hpp contract_sum_ulps and
# evidence_weight_rel: which directions of a step fit the step does not
# fix, _indistinct), one for every recorder.
from accumcheck_trace.error_model import EVIDENCE_WEIGHT_REL, SUM_ULPS, U32
from accumcheck_trace.heap import heap_trim

from .guard import _never_raises
from .sample import Coordinates
from .trace import real


def _worst(err, base):
    """max err/base (inf where base is 0 and err is not)."""
    hit = err > 0
    if not bool(hit.any()):
        return 0.0
    return float((err[hit] / base[hit]).max())


def _fit_terms(gram, rhs, norms, backward, tau):
    """The step fit's coefficients: the least-squares solution of
    sum_i a_i A_i = G from the Gram matrix of the unit-scaled rows (gram),
    their products with G over their norms (rhs) and the norms.

    A combination of terms whose unit rows differ by less than tau (an
    eigenvalue of gram below tau^2) is one gradient evaluated twice: the
    same batch backwarded twice at the same parameters (a batch drawn again
    in the next epoch before its window stepped, a sampler drawing with
    replacement), here with different loss weights.  G fixes only the sum
    over such a group, never how it splits (solving for the split divides
    float32 rounding by that eigenvalue: coefficients like 1.009 and 0.960
    and a residual thousands of times the float32 bound).  There the
    recorder takes, of all the splits that fit G equally, the one whose
    backward passes' coefficients differ least from one another (backward:
    which terms are backward passes; the previous step's gradient is not):
    a change of the whole accumulated gradient (a / K, an unscale, a clip, a
    mean over ranks) scales every coefficient alike, and no step can show
    more of the split than that."""
    lam, V = torch.linalg.eigh(gram)
    keep = lam > tau * tau
    Vk = V[:, keep]
    y = Vk @ ((Vk.t() @ rhs) / lam[keep])
    sol = y / norms
    if bool(keep.all()):
        return sol
    # sol + Z z, z chosen so the backward coefficients are closest to their
    # mean (a least-squares problem in the few null directions).
    Z = V[:, ~keep] / norms[:, None]
    b = torch.tensor(backward, dtype=torch.bool)
    if int(b.sum()) == 0:
        return sol
    C = torch.zeros((len(backward), len(backward)), dtype=gram.dtype)
    idx = b.nonzero().flatten()
    C[idx.unsqueeze(1), idx.unsqueeze(0)] = -1.0 / len(idx)
    C[idx, idx] += 1.0
    z = torch.linalg.pinv(C @ Z) @ -(C @ sol)
    return sol + Z @ z


class _Rows:
    """The float64 vectors the fits use, in one preallocated matrix that
    grows by doubling: row 0 the previous step's gradient, rows 1.. the
    backward passes since it, then spare rows for the consumed gradient, the
    recomputed g_j and scratch.  A row holds the recorder's coordinates of
    every parameter (sample.Coordinates: a fixed sample of each tensor's
    elements; all of them where coords is None), so its length d does not
    grow with the model beyond the number of tensors.  Every row is written
    in place: on a loaded machine a fresh vector costs more (page faults)
    than the arithmetic on it."""

    def __init__(self, params, rows, coords=None):
        self.coords = coords if coords is not None else Coordinates(params, sampled=False)
        self.slices = self.coords.slices
        self.n = self.coords.d
        self.m = torch.zeros((rows, self.n), dtype=torch.float64)
        self.views = {}  # row -> its per-parameter slices (the gradient hooks' destinations)
        # A backward pass's coordinates of gradients on an accelerator are
        # gathered there (a float64 row on each device, its slices) and
        # reach the host once at the pass's end (end_pass), not once per
        # tensor: on a GPU, one synchronisation a pass.
        self.stages, self.staged = {}, []

    def row(self, i):
        if i >= self.m.shape[0]:
            grown = torch.zeros((2 * i, self.n), dtype=torch.float64)
            grown[:self.m.shape[0]] = self.m
            self.m = grown
            self.views = {}
        return self.m[i]

    def row_views(self, i):
        """Row i cut into the parameters' slices (views, made once)."""
        self.row(i)
        v = self.views.get(i)
        if v is None:
            v = self.views[i] = [self.m[i, a:b] for a, b in self.slices]
        return v

    def begin_pass(self, i):
        """Row i zeroed for a backward pass; its per-parameter slices."""
        self.row(i).zero_()
        self.staged = []
        return self.row_views(i)

    def dest(self, i, device, views):
        """Where parameter i's coordinates of a gradient on `device` go in
        this pass: its slice of the host row (views), or of the device's
        stage (zeroed at its first use in the pass)."""
        if device.type == "cpu":
            return views[i]
        stage = self.stages.get(device)
        if stage is None:
            row = torch.zeros(self.n, dtype=torch.float64, device=device)
            stage = self.stages[device] = (row, [row[a:b] for a, b in self.slices])
        if device not in self.staged:
            stage[0].zero_()
            self.staged.append(device)
        return stage[1][i]

    def end_pass(self, i):
        """The pass's staged coordinates into row i: one transfer to the
        host per device (a stage holds zeros outside its device's slices,
        so adding it to the host's row leaves every other slice as it is;
        a row written on one device alone is copied, its zeros' signs
        kept)."""
        staged, self.staged = self.staged, []
        for device in staged:
            if len(staged) == 1 and not bool(self.m[i].any()):
                self.m[i].copy_(self.stages[device][0])
            else:
                self.m[i].add_(self.stages[device][0].to("cpu"))

    def views_of(self, v):
        """A row-long vector cut into the parameters' slices."""
        return [v[a:b] for a, b in self.slices]

    def take(self, i, t):
        """Parameter i's coordinates of t (a gradient or parameter shaped
        like it)."""
        return self.coords.take(i, t)

    def fill(self, dst, tensors):
        """dst <- the tensors' coordinates, zeros where one is None; those
        of tensors on an accelerator gathered there (in dst's dtype: the
        same conversion) and brought to the host once per device."""
        away = {}
        for i, ((a, b), t) in enumerate(zip(self.slices, tensors)):
            if t is None:
                dst[a:b].zero_()
                continue
            x = self.coords.take(i, t)
            if x.device == dst.device:
                dst[a:b].copy_(x)
            else:
                away.setdefault(x.device, []).append((a, b, x))
        for parts in away.values():
            host = torch.cat([x.to(dst.dtype) for _, _, x in parts]).to(dst.device)
            at = 0
            for a, b, _ in parts:
                dst[a:b].copy_(host[at:at + b - a])
                at += b - a
        return dst


class StepFit:
    """Each optimizer step's fit (a mixin of ContractRecorder)."""

    def _indistinct(self, terms):
        """Below which singular value a direction of the unit-scaled terms
        is not fixed by the step (terms: the step's, every rank's backward
        passes under DDP): the consumed gradient is known to the step's
        float32 accumulation bound, (terms + contract_sum_ulps) u32 of its
        scale, which moves the coefficients along a direction of singular
        value s by that over s; where that exceeds evidence_weight_rel (the
        precision at which certify reads a weight: error model) the
        direction is one gradient evaluated twice, whatever its float32
        evaluations' rounding (two backward passes of one batch differ by
        ~1e-7 of their norm in float32, ~1e-2 in bfloat16: the latter the
        step resolves).  Far below any two distinct batches' gradients."""
        return (terms + SUM_ULPS) * U32 / EVIDENCE_WEIGHT_REL

    def _step_terms(self):
        """The vectors a step's consumed gradient is fitted over, as rows
        of one matrix, and their refs for the coef rows: the previous
        step's gradient (-1) and the backward passes since it."""
        first = 0 if self.has_prev else 1
        refs = ([-1] if self.has_prev else []) + list(self.since_step)
        return self.buf.m[first:1 + len(self.since_step)], refs

    def _consumed(self):
        """The gradient the optimizer consumes, per recorded parameter."""
        return [p.grad for p in self.params]

    def _consumed_vector(self, grads):
        """The consumed gradient as one float64 vector of the whole
        parameters (self.vec[0])."""
        return self.buf.fill(self.vec[0], [None if g is None else self._full(g) for g in grads])

    def _fit_space(self, A, G, terms):
        """The rows and the consumed gradient restricted to what the step
        fit solves for: everything here (a sharding recorder: its shard)."""
        return A, G

    @_never_raises
    def _before_step(self):
        heap_trim()  # before the optimizer's state and update (accumcheck_trace.heap)
        self._ema_poll(at_step=True)
        self._flush_skip()  # a skipped window whose scaler.update() never came
        self._recompute_pending()
        if self.step_found_inf:
            # A fused optimizer told found_inf by GradScaler.step updates
            # nothing: the scaler's skipped window (scaler.py records it).
            return
        grads = self._consumed()
        G = self._consumed_vector(grads)
        if self.step_scale is not None:
            G.div_(self.step_scale)  # what the fused step consumes
        lr = float(self.optimizer.param_groups[0]["lr"])
        if not bool(torch.isfinite(G).all()):
            # A step on a gradient holding inf or NaN (first seen at the
            # recorder's sampled coordinates), which a loss scaler would
            # have skipped: recorded for certify, not fitted (scaler.py).
            self._overflow_stepped(lr)
            return
        A, refs = self._step_terms()
        if refs and not bool(torch.isfinite(A).all()):
            # A backward pass since the last step overflowed and no step
            # consumed it (a loss scaler skipped that window).
            self._abandon("step %d: a backward pass since the previous step holds non-finite "
                          "values and no step consumed it: a window skipped by a loss scaler "
                          "other than torch.amp.GradScaler.step (whose skips the recorder "
                          "records); the training went on unrecorded" % self.steps)
            return
        # The part of the gradient this rank's optimizer consumes (all of
        # it, or a sharding recorder's shard) is what the fit solves for.
        Gfull = G
        A, G = self._fit_space(A, G, len(refs))
        t = self.steps
        if refs:
            # Least squares through the normal equations of the unit-scaled
            # rows (m is a handful).  A is a view of the rows, the products
            # run at BLAS speed, and the one n-long temporary is a
            # preallocated vector.
            gram = A @ A.t()
            norms = gram.diagonal().sqrt().clamp_min(1e-300)  # one pass over A fewer
            gram = gram / torch.outer(norms, norms)
            sol = _fit_terms(gram, (A @ G) / norms, norms, [r != -1 for r in refs],
                             self._indistinct(len(refs)))
            coef = sol.tolist()
            tmp = torch.mv(A.t(), sol, out=self.vec[3][:G.numel()])
            resid = float(torch.dist(tmp, G))
            vnorms = norms.tolist()
            scale = sum(abs(a) * v for a, v in zip(coef, vnorms))
        else:
            coef, resid, scale, vnorms = [], float(G.norm()), 0.0, []
        # How many of the consumed gradient's elements bfloat16 cannot hold
        # (0: a bf16 gradient buffer; certify's low-precision-grad-buffer).
        off_bf16 = int((G.to(torch.bfloat16).double() != G).sum())
        self.rows.append("step,%d,%d,,,%d,,%s,%s,%s\n" % (t, len(refs), off_bf16, real(lr),
                                                          real(resid), real(scale)))
        for ref, a, v in zip(refs, coef, vnorms):
            self.rows.append("coef,%d,%s,,,,,%s,,%s\n" % (t, ref, real(a), real(v)))
        self.buf.row(0).copy_(Gfull)
        self.has_prev = True
        self.events.append(("optimizer_step", t, -1, lr))
        self._replay_step(grads)
