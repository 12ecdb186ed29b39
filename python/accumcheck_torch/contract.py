"""The contract tier's recorder: certify the gradient accumulation of any
nn.Module, without an export bundle (README "Two tiers of certification").

    recorder = ContractRecorder(model, optimizer, loss_fn=summed_loss, count_fn=items,
                                accumulation=K, out="trace/", items="tokens")
    for epoch in range(E):
        for i, batch in enumerate(recorder.watch(loader)):   # your loop, unchanged
            ...
    recorder.close()
    accumcheck certify --contract --trace trace/

Trainers whose optimizer is built late, or whose loader a framework draws:
    rec = ContractRecorder(model, None, summed_loss, items, accumulation=K)
    rec.attach(optimizer)          # once it exists, before its first step
    rec.epoch()                    # at each epoch's start
    rec.mark(batch)                # each micro-batch, before its forward
An EMA of the model (judged once per optimizer step, after it):
    rec.ema(ema)                   # AveragedModel, a timm ModelEmaV2, or
                                   # your own module/parameters with decay=

The two functions you write:
    summed_loss(model, batch) -> the SUM of the item losses of the batch
        (reduction="sum"; per-token losses: summed over loss-bearing tokens)
    items(batch) -> the number of loss-bearing items (samples, or tokens
        that are not padding)
Everything else is your own loop, model, optimizer and DataLoader.

What it measures, per micro-batch j (one item of the watched loader):
  - g_j: the gradient of summed_loss at the parameters the micro-batch's
    forward saw, recomputed on a copy of the model in the model's own
    precision, with the same batch and the same randomness (the CPU RNG
    state captured at its forward is replayed, so dropout draws the same
    masks; the copy is in train mode and its BatchNorm running statistics
    are its own, so yours are untouched); on a sample of micro-batches
    (every calibrate_every-th, default 16, the first included) the same
    recompute in float64 calibrates how far a
    float32 gradient of this model may honestly stray (cal_j = |g32 - g64|
    / |g64|, the run's largest used for the others);
  - per backward pass b (autograd gradient hooks on every parameter, so any
    call style is seen): the gradient c_b it added to .grad, fitted as
    w_b * g_j of the micro-batch drawn last: the weight w_b and the
    relative residual;
  - per clip_grad_norm_ call: the factor it applied, the float64 norm of
    the gradient it saw and its max_norm (a recorded scalar: the
    coefficient engine's clip symbol);
  - per optimizer step t: the gradient it consumed, fitted by least squares
    as beta * G_{t-1} + sum_b a_b c_b over the backward passes since the
    previous step (beta: what .grad still held of the previous step's
    gradient: 0 after zero_grad, 1 when never zeroed; one batch backwarded
    twice at the same parameters is one gradient, whose split the step
    cannot show: see _fit_terms); the lr it used
    (judged against the declared schedule: certify's lr channel); and the
    update against PyTorch's own optimizer class replayed once from the
    recorded parameters, state and gradient, in units of u32 of
    |p| + |update|.
The judging (which g_j with which weight each step holds, against the
coefficient engine's predictions) is `accumcheck certify --contract`.
"""

import contextlib
import copy
import inspect
import sys

import torch
import torch._functorch.config as _functorch_config
import torch._inductor.config as _inductor_config
import torch.utils.checkpoint

from .recorder import at_backward_end, eager, swap_clip
from .schedule import Schedule
from .trace import (TRACE_SCHEMA, VERSION, Recording, Refused, real, stopped_by, unseen_meta,
                    write_trace)

CONTRACT_HEADER = "kind,index,ref,epoch,version,items,samples,value,residual,scale"
U32 = 2.0 ** -24
# oracle/error_model.hpp contract_replay_ulps (the judging is certify's; this
# only scales what the trace reports).
REPLAY_ULPS = 16.0
# oracle/error_model.hpp contract_sum_ulps and evidence_weight_rel: which
# directions of a step fit the step does not fix (_indistinct).
SUM_ULPS = 2.0
EVIDENCE_WEIGHT_REL = 1e-3
# The declared lr schedule's keys (a scenario's [schedule] table).
SCHEDULE_KEYS = ("kind", "warmup", "total", "step_size", "gamma")
# sim/limits.cpp schedule_rows: the most rows certify reads of schedule.csv.
SCHEDULE_ROWS = 10_000_000


def _to(batch, dtype):
    """The batch with its floating tensors in `dtype` (indices untouched)."""
    if torch.is_tensor(batch):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, dtype) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, dtype) for k, v in batch.items()}
    return batch


def _compiled(output):
    """The output of a torch.compile'd graph (its autograd node is
    AOTAutograd's CompiledFunction)."""
    try:
        t = _first(output)
    except (TypeError, IndexError, StopIteration, KeyError):
        return False
    return t.grad_fn is not None and "Compiled" in type(t.grad_fn).__name__


def _first(batch):
    t = batch
    while not torch.is_tensor(t):
        t = next(iter(t.values())) if isinstance(t, dict) else t[0]
    return t


def _same_values(t, drawn):
    """t holds the drawn tensor's values: equal, or its cast to t's
    floating dtype (a bf16 model's loop casts each batch)."""
    if t.dtype == drawn.dtype:
        return torch.equal(t, drawn)
    return t.is_floating_point() and drawn.is_floating_point() and torch.equal(t, drawn.to(t.dtype))


class _PlainReentrant:
    """Stands in for torch.utils.checkpoint.CheckpointFunction: the
    checkpointed function run once, its activations kept."""

    @staticmethod
    def apply(function, preserve_rng_state, *args):
        return function(*args)


def _plain_generator(fn, preserve_rng_state=True, context_fn=None, *rest, **kw):
    """Stands in for torch.utils.checkpoint's non-reentrant generator:
    checkpoint() runs the function after its one yield, plainly."""
    yield


@contextlib.contextmanager
def _checkpoints_run_plain():
    """torch.utils.checkpoint.checkpoint runs its function plainly (once,
    its activations kept) inside: the recorder's copy computes the
    reference gradient without the recomputation, so a checkpointed
    trainer's gradients are compared with the model's own, uncheckpointed
    ones (what checkpointing must not change), at the cost of one forward
    and one backward.  checkpoint() looks both names up when called; a
    torch without them keeps its checkpointing (the same gradient, dearer)."""
    mod = torch.utils.checkpoint
    swaps = [(name, new) for name, new in (("CheckpointFunction", _PlainReentrant),
                                           ("_checkpoint_without_reentrant_generator",
                                            _plain_generator))
             if hasattr(mod, name)]
    saved = [(name, getattr(mod, name)) for name, _ in swaps]
    for name, new in swaps:
        setattr(mod, name, new)
    try:
        yield
    finally:
        for name, old in saved:
            setattr(mod, name, old)


def _closure_decay(fn):
    """The decay of torch.optim.swa_utils.get_ema_multi_avg_fn(decay) /
    get_ema_avg_fn(decay) (a closure over `decay`), else None."""
    fn = inspect.unwrap(fn) if fn is not None else None  # torch.no_grad()'s wrapper
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells or "decay" not in code.co_freevars:
        return None
    return float(cells[code.co_freevars.index("decay")].cell_contents)


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
    recomputed g_j and scratch.  Every n-long vector is written in place: on
    a loaded machine a fresh 1 MB tensor costs more (page faults) than the
    arithmetic on it."""

    def __init__(self, params, rows):
        self.slices, at = [], 0
        for p in params:
            self.slices.append((at, at + p.numel()))
            at += p.numel()
        self.n = at
        self.m = torch.zeros((rows, at), dtype=torch.float64)
        self.views = {}  # row -> its per-parameter slices (the gradient hooks' destinations)

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

    def fill(self, dst, tensors):
        """dst <- the tensors flattened, zeros where one is None."""
        for (a, b), t in zip(self.slices, tensors):
            if t is None:
                dst[a:b].zero_()
            else:
                dst[a:b].copy_(t.detach().reshape(-1))
        return dst


class _Output:
    """The model as summed_loss sees it when g_j is taken from the forward
    your loop just ran: calling it returns that forward's output (once, for
    the same input); any attribute is the model's."""

    def __init__(self, model, inp, out):
        self._model, self._inp, self._out, self.calls = model, inp, out, 0

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls > 1 or not any(t is self._inp for t in _tensors(a, k)):
            raise _NotTheForward()
        return self._out

    def __getattr__(self, name):
        return getattr(self._model, name)


class _NotTheForward(Exception):
    pass


def _tensors(args, kwargs):
    """The tensors a forward was called with, positional or keyword (a
    Transformers model is called as model(**batch))."""
    return [t for t in list(args) + list(kwargs.values()) if torch.is_tensor(t)]


class _Watched:
    def __init__(self, rec, loader):
        self.rec, self.loader = rec, loader

    def __iter__(self):
        self.rec._new_epoch(self.loader)
        for batch in self.loader:
            self.rec._drawn(batch)
            self.rec.watching = True
            try:
                yield batch
            finally:
                self.rec.watching = False

    def __len__(self):
        return len(self.loader)


class ContractRecorder:
    """ContractRecorder(model, optimizer, loss_fn, count_fn, accumulation,
    out="trace", items="samples", run="trainer", quiet=False,
    calibrate_every=None, lr=None, schedule=None, clip=None,
    unshifted_count_fn=None).

    schedule: the accepted lr schedule, judged by certify's lr channel
    (docs/tiers.md "Declaring the lr schedule"), in the form your trainer
    has it:
      - your scheduler object (any torch.optim.lr_scheduler scheduler over
        this optimizer, not yet stepped: LambdaLR, OneCycleLR, what
        transformers.get_*_schedule_with_warmup returns);
      - an lr_lambda, step -> factor (LambdaLR's);
      - a factory, lambda optimizer: SomeLR(optimizer, ...);
      - a factory of (optimizer, scale) whose lengths are multiplied by
        scale (then schedule-horizon-in-micro-steps is judged too);
      - a dict of a named kind like a scenario's [schedule] table:
        {"kind": "constant" | "step" | "linear" | "cosine", "warmup",
        "total", "step_size", "gamma"};
      - None: constant.
    The recorder steps its own copy (never yours) and writes the lr it
    gives after every count of scheduler.step() calls certify can need
    (schedule.csv).  lr: the base lr of a named kind (default: the
    optimizer's lr now, or its initial_lr when a scheduler already wraps
    it); a scheduler declaration gives its own lrs.
    clip: the accepted clip_grad_norm_ max_norm once per step before
    optimizer.step() (default None: no clipping accepted).
    accept: pitfall ids (sim/pitfalls.cpp) the user accepts as their loop
    (a framework's documented semantics, e.g. "partial-cycle-scale-by-k"):
    certify then judges against that loop and says so.
    unshifted_count_fn: for a causal-LM loss (items="tokens"), batch -> the
    labels that are not -100 over the UNSHIFTED labels (position 0 of each
    sequence included), the count a loop that forgets the shift takes:
    certify's token-count-unshifted-labels then predicts each window's count
    from it, also where prompts are masked with -100 (default None: each
    sequence's position 0 assumed counted).  The framework integrations pass
    it for their causal-LM head."""

    def __init__(self, model, optimizer=None, loss_fn=None, count_fn=None, accumulation=None,
                 out="trace", items="samples", run="trainer", quiet=False, calibrate_every=None,
                 lr=None, schedule=None, clip=None, accept=(), unshifted_count_fn=None):
        self.abandoned = None  # why the run ended without its trace (see _abandon)
        if loss_fn is None or count_fn is None or accumulation is None:
            raise Refused("ContractRecorder: pass loss_fn= (the summed loss of a batch), "
                          "count_fn= (its loss-bearing items) and accumulation= (K)")
        if items not in ("samples", "tokens"):
            raise Refused("items must be 'samples' or 'tokens', got %r" % (items,))
        if int(accumulation) < 1:
            raise Refused("accumulation must be >= 1, got %r" % (accumulation,))
        self.model, self.optimizer = model, None
        self.loss_fn, self.count_fn = loss_fn, count_fn
        self.unshifted_count_fn = unshifted_count_fn
        self.K, self.out, self.items_kind, self.run = int(accumulation), out, items, run
        # The float64 calibration recompute on every calibrate_every-th
        # micro-batch (default 16); certify judges the others with the run's
        # largest calibration.
        self.calibrate_every = max(1, int(calibrate_every or 16))
        self.lr_declared = lr
        self.lr0 = None
        # A scheduler declaration (not a named kind): tabulated into
        # schedule.csv by a Schedule made when the optimizer is attached.
        self.declared, self.schedule_declared = None, None
        if schedule is not None and not isinstance(schedule, dict):
            if lr is not None:
                raise Refused("lr: a scheduler declaration gives its own lr; pass lr only with "
                              "a named schedule kind")
            self.schedule_declared = schedule
            schedule = {"kind": "table"}
        schedule = dict(schedule or {"kind": "constant"})
        bad = sorted(set(schedule) - set(SCHEDULE_KEYS))
        if bad or schedule.get("kind") not in ("constant", "step", "linear", "cosine") and \
                self.schedule_declared is None:
            raise Refused("schedule: expected {'kind': 'constant' | 'step' | 'linear' | "
                          "'cosine', 'warmup', 'total', 'step_size', 'gamma'}, got %r" % (schedule,))
        self.schedule = schedule
        self.clip_max = None if clip is None else float(clip)
        self.accept = [accept] if isinstance(accept, str) else list(accept or ())
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.n = sum(p.numel() for p in self.params)
        self.dtype = self.params[0].dtype
        # The copies the recomputes run on: the model's precision (g_j) and
        # float64 (calibration).
        self.mref = self._replica(model).train()
        self.m64 = self._replica(model).double().train()
        self.pref = [p for p in self.mref.parameters() if p.requires_grad]
        self.p64 = [p for p in self.m64.parameters() if p.requires_grad]
        self.first, self.forwarded, self.current = [], [], -1
        # [epoch, version, items, samples, rng, batch, done, cal, unshifted items or None]
        self.micro = []
        self.backwards = []    # [micro, version, row of c in self.buf, fit]
        self.epochs = []       # [dataset items, batch size] per watched epoch
        self.loader_lengths = []  # len(loader) per watched epoch (0: none)
        self.rows = []         # contract.csv rows
        # [version, factor, norm, max_norm, shard norm or None, off_bf16 or None]
        self.clips = []
        self.events = []       # (kind, step, micro, lr)
        self.steps = 0
        self.since_step = []   # backward indices since the last step
        self.has_prev = False  # rows row 0: the gradient the last step consumed
        # Rows: 0 previous G, 1..B the backward passes since it; four spare
        # vectors (consumed G, g_j, g64, scratch) live outside the matrix.
        self.buf = _Rows(self.params, self.K + 2)
        self.vec = [torch.zeros(self.n, dtype=torch.float64) for _ in range(4)]
        self.seen = [False] * len(self.params)
        self.gfwd = {}         # micro-batch -> g_j taken from your forward
        self.no_take = False   # taking it failed on an eager forward: not tried again
        self.spare = []        # free n-long float64 vectors
        self.pending = None    # (micro-batch, input) of the forward running
        self.taking = False    # inside our own autograd.grad: hooks ignore it
        self.in_backward = False
        self.pass_grads = None
        self.replay = None     # (optimizer, params) of the replay, built once
        self.closed = False
        self.quiet = quiet
        self.unseen = []       # what the recorder could not see (meta.csv)
        self.notes = []        # what it saw that certify reports (meta.csv)
        self.after_fwd = None  # (micro-batch, CPU RNG state) at its forward's end
        self.rng_in_backward = []  # micro-batches whose backward drew random numbers
        self.watching = False  # inside an iteration of watch(loader)
        self.emas = None       # the declared EMA (see ema())
        self.ema_rows = []
        # The parameters' version counters when the recorder was made: a
        # change before attach() after backward passes is a step unseen.
        self.versions0 = [p._version for p in self.params]
        self._hooks = []
        self._patch_model()
        if optimizer is not None:
            self.attach(optimizer)
        self._start_recording()

    def _start_recording(self):
        """The recording's marker in the trace folder (trace.Recording): a
        run that does not reach close() leaves it, saying how far it got and
        how it ended (a rank recorder starts its own: distributed._RankLife)."""
        self._recording = Recording(self.out, on_exit=self._abandon)

    def _progress(self, write):
        """The steps and backward passes so far, for the marker (written
        at each optimizer step)."""
        rec = getattr(self, "_recording", None)
        if rec is not None:
            rec.progress(self.steps, len(self.backwards), write)

    # ---- wiring

    def attach(self, optimizer):
        """The optimizer, once your trainer has built it (a framework
        callback at train begin): before its first step.  Attaching the
        same optimizer again does nothing."""
        if optimizer is self.optimizer:
            return optimizer
        if self.closed:
            self._refuse("ContractRecorder.attach: the recorder is closed")
        if self.optimizer is not None:
            self._refuse("ContractRecorder.attach: an optimizer is already attached (one "
                          "optimizer per recorder; a second one's steps would be unseen)")
        if not hasattr(optimizer, "param_groups") or not hasattr(optimizer, "register_step_pre_hook"):
            self._refuse("ContractRecorder.attach: expected a torch.optim.Optimizer, got %s"
                          % type(optimizer).__name__)
        if self.backwards and [p._version for p in self.params] != self.versions0:
            self._refuse("ContractRecorder.attach: the parameters changed after %d backward "
                          "pass(es) were recorded and before the optimizer was attached: an "
                          "optimizer step the recorder could not see; attach it before its "
                          "first step (ContractRecorder(model, optimizer, ...), or "
                          "rec.attach(optimizer) at train begin)" % len(self.backwards))
        if self.schedule_declared is not None:
            try:
                self.declared = Schedule(self.schedule_declared, optimizer, self.K)
            except Refused as e:
                # Nothing left patched by a refused declaration, the marker
                # (once recording) saying so.
                self._abandon("the recorder refused: " + e.message, say=False)
                raise
        self.optimizer = optimizer
        group = optimizer.param_groups[0]
        lr = self.lr_declared
        self.lr0 = float(lr if lr is not None else group.get("initial_lr", group["lr"]))
        self._patch_optimizer()
        return optimizer

    def epoch(self, loader=None):
        """Starts an epoch of micro-batches marked with mark(): call it at
        each epoch's start.  loader (optional): the epoch's DataLoader, whose
        dataset size and batch size let certify see micro-batches it should
        have drawn and did not (drop_last)."""
        self._new_epoch(loader)

    def mark(self, batch):
        """One micro-batch your loop (or a framework) drew, marked before its
        forward: the alternative to iterating over watch(loader).  Returns
        the batch."""
        if self.watching:
            self._refuse("ContractRecorder.mark: inside an iteration over rec.watch(loader), "
                          "which marks every batch itself; use one or the other")
        if self.closed:
            self._refuse("ContractRecorder.mark: the recorder is closed")
        if not self.epochs:
            self._new_epoch(None)
        self._drawn(batch)
        return batch

    def ema(self, ema, decay=None):
        """Declares the EMA of the model your loop keeps, judged by certify
        once per optimizer step: ema = d*ema + (1-d)*p with the stepped
        parameters, exactly one update after each step.  ema: a
        torch.optim.swa_utils.AveragedModel (its decay read from
        get_ema_multi_avg_fn / get_ema_avg_fn, or pass decay=), a timm
        ModelEmaV2-shaped object (.module and .decay), or your own module
        or list of tensors, one per model parameter in model.parameters()
        order, with decay=.  Returns ema."""
        if self.emas is not None:
            self._refuse("ContractRecorder.ema: an EMA is already declared (one per recorder)")
        kind, module = type(ema).__name__, None
        if isinstance(ema, torch.optim.swa_utils.AveragedModel):
            module = ema.module
            if decay is None:
                decay = _closure_decay(ema.multi_avg_fn) or _closure_decay(ema.avg_fn)
            if decay is None:
                self._refuse("ContractRecorder.ema: this AveragedModel averages without an EMA "
                              "decay (the SWA running mean, or an avg_fn the recorder cannot "
                              "read): pass rec.ema(averaged, decay=d) for "
                              "multi_avg_fn=get_ema_multi_avg_fn(d)")
        elif isinstance(getattr(ema, "module", None), torch.nn.Module) and hasattr(ema, "decay"):
            module = ema.module  # timm's ModelEmaV2 / V3
            decay = float(ema.decay) if decay is None else decay
        elif isinstance(ema, torch.nn.Module):
            module = ema
        if decay is None:
            self._refuse("ContractRecorder.ema: pass decay= (the d of ema = d*ema + (1-d)*p) "
                          "for %s" % kind)
        tensors = list(module.parameters()) if module is not None else list(ema)
        ours = list(self.model.parameters())
        if len(tensors) != len(ours) or any(not torch.is_tensor(e) or e.shape != p.shape
                                            for e, p in zip(tensors, ours)):
            self._refuse("ContractRecorder.ema: expected one tensor per model parameter, "
                          "shaped as model.parameters() (%d), got %d (%s)"
                          % (len(ours), len(tensors), kind))
        d = float(decay)
        if not 0.0 <= d <= 1.0:
            self._refuse("ContractRecorder.ema: decay must be in [0, 1], got %r" % (decay,))
        self.emas = {"kind": kind, "decay": d, "tensors": tensors, "params": ours,
                     "version": self._ema_version(tensors),
                     "prev": self._flat64(tensors)}
        return ema

    @staticmethod
    def _ema_version(tensors):
        return sum(t._version for t in tensors)

    @staticmethod
    def _flat64(tensors):
        with torch.no_grad():
            return torch.cat([t.detach().reshape(-1).double() for t in tensors])

    def _ema_poll(self, at_step=False):
        """An EMA update since the last look (its tensors' version counters
        moved): the update measured against d*prev + (1-d)*p with the
        parameters now (an update and the next step are always a look
        apart), and against a copy of them (AveragedModel's first update),
        in u32 of d|prev| + (1-d)|p| (error model: contract_ema_ulps, judged
        by certify); the decay the update moved by, fitted; where it was (the
        steps done, the backward passes since the last one, at_step: at the
        step's pre-hook, i.e. before optimizer.step())."""
        e = self.emas
        if e is None:
            return
        v = self._ema_version(e["tensors"])
        if v == e["version"]:
            return
        e["version"] = v
        d, prev = e["decay"], e["prev"]
        new, p = self._flat64(e["tensors"]), self._flat64(e["params"])
        with torch.no_grad():
            base = prev.abs().mul(d).add_(p.abs(), alpha=1 - d)
            err = (new - prev.mul(d).add(p, alpha=1 - d)).abs_()
            decay_u = _worst(err, base) / U32
            copy_u = _worst((new - p).abs_(), p.abs()) / U32
            a = prev - p
            aa = float(a.dot(a))
            fitted = float((new - p).dot(a)) / aa if aa > 0 else float("nan")
        self.ema_rows.append("ema,%d,%d,,%d,%d,,%s,%s,%s\n" % (
            len(self.ema_rows), len(self.since_step), self.steps, int(at_step),
            real(decay_u), real(copy_u), real(fitted)))
        e["prev"] = new

    def _unpatch(self):
        """Closed: the hooks removed, clip_grad_norm_ and the compile
        settings restored (once)."""
        if self.closed:
            return
        self.closed = True
        for h in self._hooks:
            h.remove()
        self._restore_clip()
        _functorch_config.donated_buffer, _inductor_config.fallback_random = self._compile_config

    def _refuse(self, message):
        """A misuse of the recorder: it ends without a trace (nothing left
        patched, its marker saying it refused), and Refused."""
        self._abandon("the recorder refused: " + message, say=False)
        raise Refused(message)

    def _abandon(self, why, say=True):
        """The run ends without its trace (an exception, a refusal, a
        signal, the interpreter's exit before close()): the hooks go, the
        marker says why, nothing is written."""
        if self.abandoned:
            return
        self.abandoned = why
        rec = getattr(self, "_recording", None)
        if rec is not None:
            rec.end(why)
        if say:
            sys.stderr.write("accumcheck_torch: the recorder ends without writing a trace: %s "
                             "(%s holds its marker; certify refuses it)\n" % (why, self.out))
        self._unpatch()

    # ---- what a sharding recorder overrides (fsdp.ContractFSDPRecorder)

    def _replica(self, model):
        """A copy of the model the recomputes run on."""
        return copy.deepcopy(model)

    def _source(self):
        """The parameters the recomputes load: the model's own."""
        return self.params

    def _full(self, t):
        """A gradient or parameter as the whole tensor (a shard gathered)."""
        return t

    def _local(self, t):
        """A gradient, parameter or state tensor as the optimizer steps it."""
        return t

    # ---- the loader

    def watch(self, loader):
        """Your DataLoader, yielding the same batches; each iteration over
        it is an epoch."""
        return _Watched(self, loader)

    def _new_epoch(self, loader):
        ds = getattr(loader, "dataset", None)
        self.epochs.append([len(ds) if ds is not None else -1,
                            getattr(loader, "batch_size", None)
                            # Accelerate's loaders keep it on their batch sampler
                            or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
                            or -1])
        try:
            self.loader_lengths.append(len(loader))
        except TypeError:
            self.loader_lengths.append(0)

    def _schedule_rows(self):
        """How many scheduler.step() counts certify can need: one per
        micro-batch the loaders hold (drawn or not) and one per epoch, for
        every rank (ddp-scheduler-per-rank), and the first."""
        micro = len(self.micro) + sum(self.loader_lengths)
        rows = getattr(self, "world", 1) * (micro + len(self.epochs)) + 2
        if rows > SCHEDULE_ROWS:
            self._refuse("schedule: %d scheduler.step() counts to tabulate, more than the "
                         "schedule_rows limit %d (sim/limits.cpp)" % (rows, SCHEDULE_ROWS))
        return rows

    def _drawn(self, batch):
        self._ema_poll()
        self._recompute_pending()
        with torch.no_grad():
            items = int(self.count_fn(batch))
            unshifted = (None if self.unshifted_count_fn is None
                         else int(self.unshifted_count_fn(batch)))
        first = _first(batch)
        self.micro.append([len(self.epochs) - 1, self.steps, items, int(first.shape[0]),
                           torch.get_rng_state(), batch, None, float("nan"), unshifted])
        self.first.append(first.data_ptr())
        self.forwarded.append(False)
        self.current = len(self.micro) - 1

    def _forward_hook(self, module, args, kwargs):
        """The forward of a drawn batch (matched by its first tensor's
        storage, passed positionally or by keyword; a loop that prefetches
        its window draws every batch before the first forward): the RNG
        state its dropout will draw from, and the parameter version it
        sees."""
        if not torch.is_grad_enabled():
            return
        self._ema_poll()
        for t in _tensors(args, kwargs):
            ptr = t.data_ptr()
            for j in range(len(self.micro) - 1, -1, -1):
                # A released batch's storage may hold another tensor now
                # (a cast copy of a later batch): only batches still held.
                if self.first[j] == ptr and not self.forwarded[j] and self.micro[j][5] is not None:
                    self.forwarded[j] = True
                    self.micro[j][4] = torch.get_rng_state()
                    self.micro[j][1] = self.steps
                    self.current = j
                    self.pending = (j, t)
                    return
        # No storage matched: the inputs are copies of a drawn batch (a
        # data-parallel wrapper or a device move copies them, as
        # Transformers' Trainer does under DDP; a bf16 model's loop casts
        # them): the oldest unforwarded micro-batch whose first tensor has
        # the same values (in the input's dtype).
        for j, done in enumerate(self.forwarded):
            if done or self.micro[j][5] is None:
                continue
            mine = _first(self.micro[j][5])
            for t in _tensors(args, kwargs):
                if t.shape == mine.shape and _same_values(t, mine):
                    self.forwarded[j] = True
                    self.micro[j][4] = torch.get_rng_state()
                    self.micro[j][1] = self.steps
                    self.current = j
                    return

    def _forward_done(self, module, args, kwargs, output):
        """g_j from the forward your loop just ran, when summed_loss calls
        the model once on the same input: its backward only (retain_graph,
        so your backward still runs), at the same parameters, with the same
        dropout masks and BatchNorm statistics by construction.  Otherwise
        (or on any error) the micro-batch is recomputed on the copy."""
        pending, self.pending = self.pending, None
        if pending is None or not any(t is pending[1] for t in _tensors(args, kwargs)):
            return
        j = pending[0]
        try:
            self._take_from_forward(j, pending, output)
        finally:
            self.after_fwd = (j, torch.get_rng_state())

    def _take_from_forward(self, j, pending, output):
        if j in self.gfwd or not torch.is_grad_enabled() or self.no_take:
            return
        self.taking = True
        try:
            loss = self.loss_fn(_Output(self.model, pending[1], output), self.micro[j][5])
            grads = torch.autograd.grad(loss, self.params, retain_graph=True, allow_unused=True)
        except Exception as e:  # noqa: BLE001 -- the copy's recompute stands in
            if _compiled(output):
                # A recompute on the eager copy is no stand-in for compiled
                # code (its rounding, and its dropout masks: inductor draws
                # its own random numbers).
                self.unseen.append(
                    "micro-batch %d: its forward ran under torch.compile and its gradient could not "
                    "be taken from that forward (%s); an eager recompute cannot stand in for it"
                    % (j, str(e).split(". ")[0]))
            else:
                # The same forward fails the same way (reentrant activation
                # checkpointing refuses autograd.grad): the copy recomputes
                # every micro-batch, without trying each (a tenth of the
                # recorder's cost on a small checkpointed model).
                self.no_take = True
            return
        finally:
            self.taking = False
        g = self.spare.pop() if self.spare else torch.empty(self.n, dtype=torch.float64)
        self.gfwd[j] = self.buf.fill(g, grads)

    # ---- hooks

    def _patch_optimizer(self):
        rec, opt = self, self.optimizer
        orig_zero = opt.zero_grad

        def zero_grad(*a, **k):
            rec.events.append(("zero_grad", rec.steps, -1, None))
            return orig_zero(*a, **k)
        opt.zero_grad = zero_grad
        # optimizer.step(closure) (Lightning's automatic optimization runs
        # the window's last forward and backward, and the clip, inside it):
        # the closure is evaluated first, so the step's hooks below see the
        # gradient the update consumes.  A first-order optimizer calls its
        # closure once, before its update, so this is the same step; LBFGS
        # re-evaluates it and is refused.
        orig_step = opt.step

        def step(closure=None, *a, **k):
            if closure is None:
                return orig_step(*a, **k)
            if isinstance(opt, torch.optim.LBFGS):
                rec._refuse("LBFGS re-evaluates its closure within one step: the contract "
                            "tier records first-order optimizers")
            with torch.enable_grad():
                loss = closure()
            orig_step(*a, **k)
            return loss
        # An lr scheduler's own wrapper of step (its "step() before
        # optimizer.step()" check) stays underneath, and is put back by close().
        step._wrapped_by_lr_sched = getattr(orig_step, "_wrapped_by_lr_sched", False)
        self._own_step = opt.__dict__.get("step")
        opt.step = step
        # optimizer.step through its own step hooks (see Recorder._patch).
        self._hooks += [opt.register_step_pre_hook(lambda *_: rec._before_step()),
                        opt.register_step_post_hook(lambda *_: rec._after_step())]

    def _patch_model(self):
        rec = self
        self._hooks += [p.register_hook(self._grad_hook(i)) for i, p in enumerate(self.params)]
        # A torch.compile'd model, compiled while this recorder lives: its
        # backward keeps its buffers (AOTAutograd donates them by default,
        # and then refuses the retain_graph that takes g_j from your
        # forward), and inductor draws dropout's random numbers as eager
        # PyTorch does (fallback_random), so the float64 recompute replays
        # the same masks from the captured RNG state.
        self._compile_config = (_functorch_config.donated_buffer, _inductor_config.fallback_random)
        _functorch_config.donated_buffer = False
        _inductor_config.fallback_random = True
        # Under torch.compile the module hooks run eagerly (a graph break
        # around each), never traced into the graph: what they record (the
        # input, the RNG state, the output) is the forward's own.
        self._hooks.append(self.model.register_forward_pre_hook(eager(self._forward_hook),
                                                                with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(eager(self._forward_done),
                                                            with_kwargs=True))
        # clip_grad_norm_, also when imported by name before the recorder
        # existed: its code swapped for a call to the recorder (as the
        # oracle tier's Recorder does; one recorder at a time).
        def make_clip(saved):
            def clip(parameters, max_norm, *a, **k):
                if torch.is_tensor(parameters):
                    parameters = [parameters]
                parameters = list(parameters)
                norm, shard = rec._clip_norms(parameters)
                off = rec._off_bf16(parameters)
                total = saved(parameters, max_norm, *a, **k)
                rec._clipped(min(1.0, float(max_norm) / (float(total) + 1e-6)), norm, shard,
                             float(max_norm), off)
                return total
            return clip
        self._restore_clip = swap_clip(make_clip)

    def _clip_norms(self, parameters):
        """The float64 norm of the gradient a clip sees (whole: a shard
        gathered) and of this rank's shard of it (None: not sharded)."""
        with torch.no_grad():
            return float(sum(float(self._full(p.grad.detach()).double().pow(2).sum())
                             for p in parameters if p.grad is not None)) ** 0.5, None

    def _off_bf16(self, parameters):
        """How many elements of the gradient a clip sees bfloat16 cannot
        hold (0: a bf16 gradient buffer before the clip, whose factor then
        makes float32 numbers of it; certify's low-precision-grad-buffer)."""
        with torch.no_grad():
            return sum(int((g.to(torch.bfloat16).to(g.dtype) != g).sum())
                       for g in (p.grad.detach() for p in parameters if p.grad is not None))

    def _clipped(self, factor, norm, shard, max_norm, off_bf16=None):
        """A clip seen: the factor it applied, the norms of the gradient it
        saw (whole, and this rank's shard: None where not sharded), its
        max_norm (nan: a scaling seen on .grad, no clip function called)
        and the elements of that gradient bfloat16 cannot hold (None: not
        counted)."""
        self.clips.append([self.steps, factor, norm, max_norm, shard, off_bf16])
        self.events.append(("clip", self.steps, -1, None))

    def _grad_hook(self, i):
        def hook(grad):
            if self.taking:
                return None
            if not self.in_backward:
                self.in_backward = True
                self.pass_row = 1 + len(self.since_step)
                self.buf.row(self.pass_row).zero_()
                self.pass_views = self.buf.row_views(self.pass_row)
                self.seen = [False] * len(self.params)
                at_backward_end(self._end_backward)
            dst = self.pass_views[i]
            g = grad.detach().reshape(-1)
            if self.seen[i]:
                dst.add_(g.double())
            else:
                dst.copy_(g)  # a copy: .grad may take the incoming tensor
                self.seen[i] = True
            return None
        return hook

    def _end_backward(self):
        self.in_backward = False
        if not self.micro:
            self._refuse("a backward pass before any batch was drawn: iterate over "
                         "rec.watch(loader), or call rec.mark(batch) before each forward")
        if self.after_fwd is not None and self.after_fwd[0] == self.current:
            # The CPU RNG moved between the forward's end and its backward's
            # end: the backward drew random numbers (a recomputation that
            # does not replay the forward's, e.g. torch.utils.checkpoint
            # with preserve_rng_state=False around dropout).
            if not torch.equal(torch.get_rng_state(), self.after_fwd[1]):
                self.rng_in_backward.append(self.current)
            self.after_fwd = None
        self._ema_poll()
        self.since_step.append(len(self.backwards))
        self.backwards.append([self.current, self.steps, self.pass_row, None])
        self.events.append(("forward_backward", self.steps, self.current, None))
        self._progress(write=False)

    # ---- recompute and fit

    def _grad_of(self, model, params, batch, dtype, dst):
        """The copy's gradient by backward() into its own .grad (a copy's
        .grad is nobody else's), its activation checkpoints run plainly
        (_checkpoints_run_plain)."""
        for p in params:
            p.grad = None
        # Grad mode on: the recompute may run inside a step that an
        # optimizer wrapper runs under no_grad (DeepSpeed's bf16 optimizer).
        with torch.enable_grad(), _checkpoints_run_plain():
            loss = self.loss_fn(model, _to(batch, dtype))
            # One draw between the forward and its backward: a backward that
            # draws random numbers of its own (a recomputation that does not
            # replay the forward's RNG) cannot coincide with yours by accident.
            torch.rand(1)
            loss.backward()
        self.buf.fill(dst, [p.grad for p in params])
        for p in params:
            p.grad = None
        return dst

    def _recompute_pending(self):
        """g_j (in the model's precision; float64 on the calibration sample)
        for every micro-batch that had a backward pass and no recompute yet,
        at the current parameters (those of its forward: called before any
        step), then the weight fit of each of its backward passes."""
        unrecomputed = sorted({b[0] for b in self.backwards if self.micro[b[0]][6] is None})
        if not unrecomputed:
            return
        # A micro-batch whose backward drew random numbers has no one
        # gradient to calibrate against (the note says why).
        calibrate = [j for j in unrecomputed
                     if j % self.calibrate_every == 0 and j not in self.rng_in_backward]
        with torch.no_grad():
            if any(j not in self.gfwd for j in unrecomputed):
                for dst, src in zip(self.pref, self._source()):
                    dst.copy_(src)
            if calibrate:
                for dst, src in zip(self.p64, self._source()):
                    dst.copy_(src)
        keep = torch.get_rng_state()
        g64, tmp = self.vec[2], self.vec[3]
        for j in unrecomputed:
            m = self.micro[j]
            if m[1] != self.steps:
                self._refuse("micro-batch %d: an optimizer step between its forward and its "
                             "recompute" % j)
            if j in self.gfwd:
                g = self.gfwd.pop(j)
                self.spare.append(g)
            else:
                g = self.vec[1]
                torch.set_rng_state(m[4])
                self._grad_of(self.mref, self.pref, m[5], self.dtype, g)
            if j in calibrate:
                torch.set_rng_state(m[4])
                self._grad_of(self.m64, self.p64, m[5], torch.float64, g64)
                n64 = float(g64.norm())
                m[7] = float(torch.dist(g, g64)) / n64 if n64 > 0 else 0.0
            m[5], m[6] = None, True  # the batch is no longer needed
            gg = float(g.dot(g))
            for rec in self.backwards:
                if rec[0] != j or rec[3] is not None:
                    continue
                c = self.buf.m[rec[2]]
                w = float(c.dot(g)) / gg if gg > 0 else 0.0
                wn = abs(w) * gg ** 0.5
                if wn > 0:
                    torch.mul(g, w, out=tmp)
                    resid = float(torch.dist(c, tmp)) / wn
                else:
                    resid = 0.0 if float(c.norm()) == 0 else float("inf")
                rec[3] = (w, resid)
        torch.set_rng_state(keep)

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

    def _before_step(self):
        self._ema_poll(at_step=True)
        self._recompute_pending()
        grads = self._consumed()
        G = self._consumed_vector(grads)
        A, refs = self._step_terms()
        # The part of the gradient this rank's optimizer consumes (all of
        # it, or a sharding recorder's shard) is what the fit solves for.
        Gfull = G
        A, G = self._fit_space(A, G, len(refs))
        t = self.steps
        lr = float(self.optimizer.param_groups[0]["lr"])
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

    def _replay_step(self, grads):
        """PyTorch's own optimizer class, built once on copies of the
        parameters, stepped from this step's parameters, state and gradient
        (before your step runs): what your step must give.  The copies are
        views of one flat buffer (the parameters' dtype; float64 if they
        mix dtypes), so the comparison is a few whole-vector operations and
        nothing is allocated per step."""
        keys = [p for g in self.optimizer.param_groups for p in g["params"]]
        ours = [self._local(p) for p in keys]
        if self.replay is None:
            dts = {p.dtype for p in ours}
            dt = dts.pop() if len(dts) == 1 else torch.float64
            total = sum(p.numel() for p in ours)
            flat = torch.zeros(total, dtype=dt)
            params, at = [], 0
            for q in ours:
                params.append(flat[at:at + q.numel()].view(q.shape).requires_grad_(True))
                at += q.numel()
            groups, at = [], 0
            for g in self.optimizer.param_groups:
                h = {k: v for k, v in g.items() if k != "params"}
                groups.append(dict(h, params=params[at:at + len(g["params"])]))
                at += len(g["params"])
            self.replay = (type(self.optimizer)(groups), params, flat,
                           torch.zeros_like(flat), torch.zeros_like(flat), torch.zeros_like(flat),
                           [torch.zeros_like(p) for p in params])
        opt, params, flat, before, now, tmp, gbuf = self.replay
        for g, mine in zip(opt.param_groups, self.optimizer.param_groups):
            for k, v in mine.items():
                if k != "params":
                    g[k] = v
        dsts, srcs = [], []  # copied in one foreach call
        for p, key in zip(params, keys):
            st = self.optimizer.state.get(key)
            if not st:
                opt.state.pop(p, None)
                continue
            mine = opt.state.get(p)
            if mine is None or set(mine) != set(st):
                mine = opt.state[p] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    v = self._local(v)
                    if k in mine and torch.is_tensor(mine[k]) and mine[k].shape == v.shape \
                            and mine[k].dtype == v.dtype:
                        dsts.append(mine[k])
                        srcs.append(v)
                    else:
                        mine[k] = v.clone()
                else:
                    mine[k] = copy.deepcopy(v)
        got = {id(q): g for q, g in zip(self.params, grads)}
        for key in keys:
            # An optimizer stepping tensors other than the model's (DeepSpeed's
            # flat float32 partitions) is replayed on their own gradients.
            got.setdefault(id(key), key.grad)
        with torch.no_grad():
            for p, key, q, b in zip(params, keys, ours, gbuf):
                dsts.append(p)
                srcs.append(q)
                g = got.get(id(key))
                g = None if g is None else self._local(g)
                if g is None:
                    p.grad = None
                else:
                    dsts.append(b)
                    srcs.append(g)
                    p.grad = b
            torch._foreach_copy_(dsts, srcs)
            before.copy_(flat)
        opt.step()

    def _after_step(self):
        """Your update against the replay: |p - p_replay| within 16 u32 of
        |p_replay| + |update| (error model: contract_replay_ulps), in the
        parameters' precision: |p - p_replay| is exact there (Sterbenz) and
        the bound needs no more than a few digits."""
        opt, params, flat, before, now, tmp, gbuf = self.replay
        ours = [self._local(p) for g in self.optimizer.param_groups for p in g["params"]]
        at = 0
        with torch.no_grad():
            for q in ours:
                now[at:at + q.numel()].copy_(q.reshape(-1))
                at += q.numel()
            torch.sub(flat, before, out=tmp).abs_().add_(flat.abs()).mul_(REPLAY_ULPS * U32)
            now.sub_(flat).abs_()
            hit = now > 0
            worst = float((now[hit] / tmp[hit]).max()) if bool(hit.any()) else 0.0
        self.rows.append("replay,%d,,,,,,%s,,\n" % (self.steps, real(worst * REPLAY_ULPS)))
        self.steps += 1
        for b in self.since_step:
            self.backwards[b][2] = None  # fitted; its row is free again
        self.since_step = []
        self._progress(write=True)

    # ---- output

    def close(self):
        """Recomputes what is pending, restores the optimizer and
        clip_grad_norm_, and writes the trace (meta.csv, events.csv,
        values.csv, contract.csv, then the completion record complete.csv).
        Called while an exception propagates or is handled (a `with` block
        left by it, a `finally`, an `except`), it writes no trace: the run
        did not finish, and the folder's marker says so."""
        if self.closed:
            return
        if not self.abandoned:
            why = stopped_by()
            if why:
                self._abandon(why)
                return
        self._ema_poll()
        self._recompute_pending()
        self._unpatch()
        if self.optimizer is None:
            self._refuse("ContractRecorder.close: no optimizer was attached: pass it to "
                         "ContractRecorder(model, optimizer, ...) or call rec.attach(optimizer) "
                         "before its first step")
        self.optimizer.__dict__.pop("zero_grad", None)
        self.optimizer.__dict__.pop("step", None)
        if self._own_step is not None:
            self.optimizer.step = self._own_step
        rows = []
        for j, m in enumerate(self.micro):
            # ref: the unshifted label count (unshifted_count_fn), when given.
            rows.append("micro,%d,%s,%d,%d,%d,%d,,,%s\n" % (j, "" if m[8] is None else m[8],
                                                             m[0], m[1], m[2], m[3], real(m[7])))
        for b, rec in enumerate(self.backwards):
            w, resid = rec[3] if rec[3] is not None else (float("nan"), float("nan"))
            rows.append("backward,%d,%d,,%d,,,%s,%s,\n" % (b, rec[0], rec[1], real(w), real(resid)))
        for e, (n, bs) in enumerate(self.epochs):
            rows.append("epoch,%d,,,,%d,%d,,,\n" % (e, n, bs))
        rows += self.rows + self.ema_rows
        for i, (version, factor, norm, max_norm, shard, off) in enumerate(self.clips):
            # samples: the elements of the gradient it saw bfloat16 cannot hold.
            rows.append("clip,%d,%d,,,%s,%s,%s,%s,%s\n" % (
                i, version, "" if shard is None else real(shard), "" if off is None else off,
                real(factor), real(norm), real(max_norm)))
        precision = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                     torch.float16: "float16"}.get(self.dtype, str(self.dtype))
        meta = [("schema", TRACE_SCHEMA), ("scenario", "contract"),
                ("scenario_digest", "contract"), ("engine", "pytorch"),
                ("precision", precision),
                ("tool_version", "accumcheck_torch-%s torch-%s" % (VERSION, torch.__version__)),
                ("tier", "contract"), ("accumulation", str(self.K)),
                ("items", self.items_kind), ("parameters", str(self.n)),
                ("lr", real(self.lr0))]
        meta += [("schedule_" + k, str(self.schedule[k])) for k in SCHEDULE_KEYS
                 if k in self.schedule]
        if self.clip_max is not None:
            meta.append(("clip", real(self.clip_max)))
        if self.accept:
            meta.append(("accept", "+".join(self.accept)))
        if self.rng_in_backward:
            self.notes.append(
                "the backward of %d of %d micro-batches (the first: %d) drew random numbers from "
                "the CPU RNG after its forward: a recomputation that does not replay the "
                "forward's randomness (torch.utils.checkpoint with preserve_rng_state=False "
                "around dropout?), so that gradient is not of the forward's dropout masks"
                % (len(self.rng_in_backward), len(self.micro), self.rng_in_backward[0]))
        if self.notes:
            meta.append(("notes", " | ".join(self.notes)))
        if self.emas is not None:
            meta += [("ema", self.emas["kind"]), ("ema_decay", real(self.emas["decay"]))]
        bn = sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in self.model.modules())
        if bn:
            meta.append(("batchnorm", str(bn)))
        meta += unseen_meta(self.unseen)
        # Each event's epoch: that of the last micro-batch backwarded.
        events, epoch = [], 0
        for kind, step, micro, lr in self.events:
            if micro >= 0:
                epoch = self.micro[micro][0]
            events.append("%s,%d,%d,%d,%s,0,0,,%s,,\n" % (self.run, epoch, step, micro, kind,
                                                         "" if lr is None else real(lr)))
        self._write(meta, events, rows)
        self._recording.done()

    def _extra_files(self):
        """The trace's files beside contract.csv: schedule.csv for a
        declared scheduler."""
        return {} if self.declared is None else {
            "schedule.csv": self.declared.csv(self._schedule_rows())}

    def _write(self, meta, events, rows):
        write_trace(self.out, meta, events, [],
                    extra=dict(self._extra_files(),
                               **{"contract.csv": CONTRACT_HEADER + "\n" + "".join(rows)}))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
