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

import copy
import inspect
import sys

import torch

from .capture import Capture, _tensors, compile_configs  # noqa: F401 -- _tensors: pipelining
from .fit import EVIDENCE_WEIGHT_REL, SUM_ULPS, U32, StepFit, _Rows, _worst  # noqa: F401
from .guard import _never_raises
from .replay import ELEMENTWISE, REPLAY_ULPS, Replay  # noqa: F401 -- the error model's mirrors
from .sample import PER_TENSOR, SEED, Coordinates
from .scaler import Scaler
from .schedule import Schedule
from .trace import Recording, Refused, real
from .write import CONTRACT_HEADER, SCHEDULE_KEYS, Write  # noqa: F401 -- distributed

# sim/limits.cpp schedule_rows: the most rows certify reads of schedule.csv.
SCHEDULE_ROWS = 10_000_000


def _closure_decay(fn):
    """The decay of torch.optim.swa_utils.get_ema_multi_avg_fn(decay) /
    get_ema_avg_fn(decay) (a closure over `decay`), else None."""
    fn = inspect.unwrap(fn) if fn is not None else None  # torch.no_grad()'s wrapper
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells or "decay" not in code.co_freevars:
        return None
    return float(cells[code.co_freevars.index("decay")].cell_contents)


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


class ContractRecorder(Capture, StepFit, Replay, Scaler, Write):
    """ContractRecorder(model, optimizer, loss_fn, count_fn, accumulation,
    out="trace", items="samples", run="trainer", quiet=False,
    calibrate_every=None, lr=None, schedule=None, clip=None,
    unshifted_count_fn=None, coordinates=1024, sample_seed=...).

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
        "total", "step_size", "gamma", "frequency" (scheduler.step()
        after every frequency-th optimizer step; default 1),
        "warmup_ratio" (the ratio of the horizon "warmup" was taken
        with, if it was: a trainer with another horizon takes it of
        that one)};
      - None: constant.
    The recorder steps its own copy (never yours) and writes the lr it
    gives after every count of scheduler.step() calls certify can need
    (schedule.csv).  lr: the base lr you mean (default: the optimizer's
    lr now, or its initial_lr when a scheduler already wraps it): a named
    kind's base; with a scheduler declaration, the lr the optimizer was
    meant to be built with (the table is the scheduler's as if built over
    it), so an `lr * K` written into the optimizer before the scheduler
    was built shows (schedule.Schedule).  A schedule.Cadence around a
    declaration steps it every f optimizer steps or epochs.
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
    it for their causal-LM head.
    coordinates, sample_seed: how many coordinates of each parameter tensor
    the recorder keeps, and the seed they are drawn from (sample.py; both
    in meta.csv: docs/tiers.md "What the recorder keeps")."""

    # Whole-tensor reads (a clip's bfloat16 count, an EMA) on the sampled
    # coordinates (sample.Coordinates); a sharding recorder reads its
    # local shards whole there (its rows are sampled all the same).
    _sampled = True

    def __init__(self, model, optimizer=None, loss_fn=None, count_fn=None, accumulation=None,
                 out="trace", items="samples", run="trainer", quiet=False, calibrate_every=None,
                 lr=None, schedule=None, clip=None, accept=(), unshifted_count_fn=None,
                 coordinates=PER_TENSOR, sample_seed=SEED):
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
            self.schedule_declared = schedule
            schedule = {"kind": "table"}
        schedule = dict(schedule or {"kind": "constant"})
        bad = sorted(set(schedule) - set(SCHEDULE_KEYS))
        if bad or schedule.get("kind") not in ("constant", "step", "linear", "cosine") and \
                self.schedule_declared is None:
            raise Refused("schedule: expected {'kind': 'constant' | 'step' | 'linear' | "
                          "'cosine', 'warmup', 'total', 'step_size', 'gamma', 'frequency', "
                          "'warmup_ratio'}, got %r"
                          % (schedule,))
        self.schedule = schedule
        self.clip_max = None if clip is None else float(clip)
        self.accept = [accept] if isinstance(accept, str) else list(accept or ())
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.n = sum(p.numel() for p in self.params)
        self.dtype = self.params[0].dtype
        # The precision the model computes in: its parameters', or lower
        # where its outputs are (autocast).
        self.compute_dtype = self.dtype
        # A recorder class that recomputes on copies of its own (a
        # pipeline's whole model) makes them here; this one recomputes on
        # the model itself (_recompute_on), no copy.
        self.mref = self.m64 = self.pref = self.p64 = None
        if type(self)._replica is not ContractRecorder._replica:
            self.mref = self._replica(model).train()
            self.m64 = self._replica(model).double().train()
            self.pref = [p for p in self.mref.parameters() if p.requires_grad]
            self.p64 = [p for p in self.m64.parameters() if p.requires_grad]
        self.first, self.forwarded, self.current = [], [], -1
        # [epoch, version, items, samples, rng, batch, done, cal, unshifted items or None]
        self.micro = []
        self.backwards = []    # [micro, version, row of c in self.buf, fit]
        self.open_passes = []  # backward passes whose micro-batch is still held
        self.epochs = []       # [dataset items, batch size] per watched epoch
        self.loader_lengths = []  # len(loader) per watched epoch (0: none)
        self.rows = []         # contract.csv rows
        # [version, factor, norm, max_norm, shard norm or None, off_bf16 or None]
        self.clips = []
        self.clip_terms, self.clip_lowp = 0, False  # _clip_norms: meta.csv clip_norm_terms
        self.step_scale, self.step_found_inf = None, False  # _step_scale
        self.events = []       # (kind, step, micro, lr)
        self.steps = 0
        self.since_step = []   # backward indices since the last step
        self.has_prev = False  # rows row 0: the gradient the last step consumed
        # Rows: 0 previous G, 1..B the backward passes since it; four spare
        # vectors (consumed G, g_j, g64, scratch) live outside the matrix;
        # each holds the sampled coordinates (sample.py).
        # The rows are sampled for every recorder (_sampled says only how
        # a clip's bfloat16 count and an EMA read tensors).
        self.coords = Coordinates(self.params, coordinates, sample_seed)
        self.buf = _Rows(self.params, self.K + 2, self.coords)
        self.vec = [torch.zeros(self.coords.d, dtype=torch.float64) for _ in range(4)]
        self.seen = [False] * len(self.params)
        # The output-gradient path (_take_from_forward): micro-batch -> its
        # forward's outputs and the summed loss's gradient at them, and
        # g_j's coordinates where calibrated; what the outputs' hooks saw
        # since the last backward pass ended.
        self.outs = {}
        self.out_fired = []
        self.no_take = False   # the output path does not hold: every g_j recomputed
        # meta.csv weights_read (_rounded_once): whether, on every calibrated
        # micro-batch, the summed loss's gradient at low-precision outputs was
        # its float32 gradient rounded once; and the weights not read there.
        self.read_once, self.read_checks, self.fits_recomputed = True, 0, 0
        self.recomputing = False  # inside the recorder's own forward of the model
        self.loss_of = None       # the recompute's module (_LossOf), made at its first use
        self.sample_into = None   # the calibration backward's destination (per parameter)
        self.sample_seen = []
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
        self.after_fwd = None  # (micro-batch, _rng_states()) at its forward's end
        self.rng_in_backward = []  # micro-batches whose backward drew random numbers
        self.watching = False  # inside an iteration of watch(loader)
        self.emas = None       # the declared EMA (see ema())
        self.ema_rows = []
        # The parameters' version counters when the recorder was made: a
        # change before attach() after backward passes is a step unseen.
        self.versions0 = [p._version for p in self.params]
        self._hooks = []
        self._patch_model()
        self._patch_scaler()
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

    def _step_scale(self, optimizer):
        """The loss scale a step unscales by itself (the grad_scale
        GradScaler.step sets on a fused optimizer for the call), or None; a
        step whose found_inf is set updates nothing (the scaler's skipped
        window)."""
        scale = getattr(optimizer, "grad_scale", None)
        inf = getattr(optimizer, "found_inf", None)
        self.step_scale = None if scale is None else float(scale)
        self.step_found_inf = inf is not None and float(inf) != 0.0
        return None

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
                self.declared = Schedule(self.schedule_declared, optimizer, self.K,
                                         lr=self.lr_declared)
                if self.declared.frequency > 1:
                    self.schedule["frequency"] = self.declared.frequency
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
        # The EMA is judged on the recorder's sample of coordinates too.
        self.ema_coords = Coordinates(ours, self.coords.per_tensor, self.coords.seed,
                                      sampled=self._sampled)
        self.emas = {"kind": kind, "decay": d, "tensors": tensors, "params": ours,
                     "version": self._ema_version(tensors),
                     "prev": self._flat64(tensors)}
        return ema

    @staticmethod
    def _ema_version(tensors):
        return sum(t._version for t in tensors)

    def _flat64(self, tensors):
        """The EMA's (or the parameters') sampled coordinates, float64."""
        with torch.no_grad():
            return torch.cat([self.ema_coords.take(i, t).double() for i, t in enumerate(tensors)])

    @_never_raises
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
        self._unpatch_scaler()
        functorch_config, inductor_config = compile_configs()
        functorch_config.donated_buffer, inductor_config.fallback_random = self._compile_config

    def _refuse(self, message):
        """A misuse of the recorder: it ends without a trace (nothing left
        patched, its marker saying it refused), and Refused."""
        self._abandon("the recorder refused: " + message, say=False)
        raise Refused(message)

    def _failed(self, where, e):
        """An error inside the recorder (at `where`): the recording ends
        (_abandon), your run goes on."""
        self._abandon("the recorder failed in %s (%s: %s); the training went on unrecorded"
                      % (where.lstrip("_"), type(e).__name__, str(e).split("\n")[0][:300]))

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
        # A fused optimizer under torch.amp.GradScaler unscales inside its
        # step: GradScaler.step sets its grad_scale and found_inf for the
        # call, and .grad still holds the scaled gradient (_step_scale).
        self._hooks += [opt.register_step_pre_hook(
                            lambda o, _args, _kw: rec._step_scale(o) or rec._before_step()),
                        opt.register_step_post_hook(lambda *_: rec._after_step())]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
