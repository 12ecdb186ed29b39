"""Records a PyTorch training loop in the accumcheck trace schema.

What the recorder hooks, and why each hook does not depend on how the loop
is written:
  - every parameter's gradient (Tensor.register_hook): fires inside
    autograd for every backward pass that reaches the parameter, however it
    was started (loss.backward(), torch.autograd.backward, a wrapper); the
    first hook of a pass queues an end-of-pass callback on autograd's
    engine, which records one `forward_backward` event per pass;
  - the model's forward (a forward pre-hook): the input rows of each
    forward with gradients enabled, looked up in the bundle's data to find
    the micro-batch's sample ids (an eval forward under no_grad is noted,
    not counted);
  - optimizer.step (the instance's method): the lr of param_groups[0] and
    the gradient the optimizer consumes, read from the parameters, then the
    parameters after the step;
  - torch.nn.utils.clip_grad.clip_grad_norm_ where PyTorch defines it: its
    code object is swapped, so every name bound to it -- including a
    `from torch.nn.utils import clip_grad_norm_` done before the recorder
    existed -- goes through the recorder; a clip it still did not see
    (the consumed gradient a scaled copy of the accumulated one) is
    inferred from the values and written down as inferred;
  - optimizer.zero_grad, model.zero_grad and scheduler.step (instance
    methods); a gradient zeroed by hand (p.grad = None) is seen from the
    values at the next backward.
Whatever the recorder cannot attribute is written to meta.csv as `unseen`,
and `accumcheck certify` names it and exits 2 rather than blame the loop.

The training state beyond gradients goes to state.csv (verify/trace/trace.hpp
describes its rows; certify's state checks judge it); its per-element
tensors (Adam's moments, the EMA) go to values.bin as blocks of their own
when the trace is values.bin (rows of GBs at a million parameters):
  - the loss scale of each backward pass: `loss_scale=` a callable the
    recorder polls at the end of every backward (`lambda: scaler.scale`,
    the trainer's own dynamic scaler, as DeepSpeed and Megatron carry
    theirs), or `rec.loss_scale(s)` called by the loop; the unscale
    (.grad divided by the scale) is then recognised, not taken for a clip;
    a window whose gradients hold inf/NaN and that is zeroed without an
    optimizer step is recorded as skipped;
  - the optimizer's state after every step (state['step'], exp_avg,
    exp_avg_sq), read from optimizer.state;
  - BatchNorm's running_mean, running_var and num_batches_tracked at every
    step, mapped to the scenario's buffers by order;
  - an EMA (`ema=` a torch.optim.swa_utils.AveragedModel, `ema_decay=` its
    decay): every update_parameters call and the averaged parameters after it;
  - the loss the trainer logs: `rec.log_loss(value)` where it logs;
  - autocast: a forward under torch.autocast writes `autocast` to meta.csv.
"""

# The recorder's parts: torch_hooks.py (eager, at_backward_end, swap_clip:
# shared with the contract tier), sample_ids.py (the micro-batch's sample
# ids from its inputs) and training_state.py (state.csv), mixins of
# Recorder; this module holds its life, its hooks and its rows.
import sys

import torch

from .bundle import map_parameters
from .sample_ids import SampleIds
from .torch_hooks import at_backward_end, eager, swap_clip
from .trace import TRACE_SCHEMA, VERSION, Recording, Refused, Values, real, stopped_by, unseen_meta, write_trace
from .training_state import STATE_HEADER, TrainingState

# The recorder that clip_grad_norm_'s swapped code calls (one at a time).
_ACTIVE = []


def _same(a, b):
    """a and b hold the same values, NaN where the other holds NaN (an
    overflowed gradient the scaler will skip stays NaN when unscaled)."""
    if torch.equal(a, b):
        return True
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


class Recorder(SampleIds, TrainingState):
    """Records a training loop's calls and values in the accumcheck trace schema.

    Recorder(bundle, model, optimizer, scheduler=None, out="trace",
             run="trainer", names=None, quiet=False, values="bin")
    `names` maps the model's parameter names to the scenario's explicitly
    (see map_parameters); by default they are matched by order and shape
    and the mapping is printed (unless quiet).  `values`: "bin" writes
    the values as values.bin (binary, exact, compact), "csv" as values.csv."""

    def __init__(self, bundle, model, optimizer, scheduler=None, out="trace",
                 run="trainer", names=None, quiet=False, loss_scale=None, ema=None,
                 ema_decay=None, values="bin"):
        if _ACTIVE:
            raise Refused("a Recorder is already active; close() it first")
        self.bundle, self.model, self.optimizer, self.scheduler = bundle, model, optimizer, scheduler
        self.out, self.run = out, run
        self.mapping = map_parameters(bundle, model, names)
        self.names = [n for n, _ in bundle.tensors]
        self.params = [self.mapping[n][1] for n in self.names]
        if not quiet:
            print("accumcheck_torch: parameters mapped to the scenario's tensors:")
            for n in self.names:
                m, p = self.mapping[n]
                print("  %-20s <- %s %s" % (n, m, list(p.shape)))
        self.events = []
        if values not in ("bin", "csv"):
            raise Refused("values=%r: expected 'bin' or 'csv'" % (values,))
        self.values = Values([(n, p.numel()) for n, p in zip(self.names, self.params)],
                             8 if self.params[0].dtype == torch.float64 else 4,
                             binary=values == "bin")
        self.notes = []         # call-pattern differences that change no value
        self.unseen = []        # what the recorder could not attribute
        self.steps = 0          # optimizer steps so far
        self.backwards = 0      # backward passes so far
        self.since_step = 0     # backward passes since the last optimizer step
        self.in_backward = False
        self.pending_ids = []   # sample ids of the grad-enabled forwards since the last backward
        self.pending_rows = 0
        self.zero_since_backward = False
        self.snapshot = None    # the parameters' gradients after the last backward
        self.epoch = 0
        self.epoch_ids = set()
        self.epoch_micro = 0    # micro-batches drawn in the current epoch
        self.eval_forwards = 0
        self.ambiguous_ids = 0
        self._index = self._sample_index()
        self.closed = False
        # The training state beyond gradients (state.csv).
        self.state_rows = []
        self._scale_fn = loss_scale       # polled at each backward's end
        self._scale_now = None            # rec.loss_scale(s)
        self.scale = None                 # the scale of the last backward
        self.ema, self.ema_decay, self.ema_updates = ema, ema_decay, 0
        if ema is not None and ema_decay is None:
            raise Refused("Recorder(ema=...) needs ema_decay=, the decay of its avg_fn")
        self.autocast = None
        self._bn = self._batchnorms()
        self.abandoned = None   # why the run ended without its trace (see _abandon)
        self._patch()
        _ACTIVE.append(self)
        self._start_recording()

    def _start_recording(self):
        """The recording's marker in the trace folder (trace.Recording): a
        run that does not reach close() leaves it, saying how far it got
        (of the scenario's steps) and how it ended."""
        self._recording = Recording(self.out, planned=self.bundle.steps, on_exit=self._abandon)

    def _progress(self, write):
        """The steps and backward passes so far, for the marker (written
        at each optimizer step)."""
        rec = getattr(self, "_recording", None)
        if rec is not None:
            rec.progress(self.steps, self.backwards, write)

    def _refuse(self, message):
        """A refusal once the recorder records: it ends without a trace,
        its marker saying it refused, and Refused."""
        self._abandon("the recorder refused: " + message, say=False)
        raise Refused(message)

    def _abandon(self, why, say=True):
        """The run ends without its trace (an exception, a signal, the
        interpreter's exit before close()): the hooks go, the marker says
        why, nothing is written."""
        if self.abandoned:
            return
        self.abandoned = why
        rec = getattr(self, "_recording", None)
        if rec is not None:
            rec.end(why)
        if say:
            sys.stderr.write("accumcheck_torch: the recorder ends without writing a trace: %s "
                             "(%s holds its marker; certify refuses it)\n" % (why, self.out))
        if not self.closed:
            self.closed = True
            self._unpatch()
            if self in _ACTIVE:
                _ACTIVE.remove(self)

    # ---- patching

    def _patch(self):
        rec = self
        opt, sched, model = self.optimizer, self.scheduler, self.model

        def wrap(obj, attr, before=None, after=None):
            orig = getattr(obj, attr)

            def f(*a, **k):
                if before:
                    before()
                result = orig(*a, **k)
                if after:
                    after()
                return result
            setattr(obj, attr, f)

        def zero():
            rec._maybe_skipped(rec._grads())
            rec._event("zero_grad")
        wrap(opt, "zero_grad", before=zero)
        wrap(model, "zero_grad", before=zero)
        if self.ema is not None:
            wrap(self.ema, "update_parameters", after=rec._after_ema)
        # optimizer.step through the optimizer's own step hooks, not a
        # replaced method: an LR scheduler built before the recorder checks
        # that step is still the method it wrapped, and GradScaler.step and
        # fused/foreach optimizers run the same hooks.
        self._step_hooks = [opt.register_step_pre_hook(lambda *_: rec._before_step()),
                            opt.register_step_post_hook(lambda *_: rec._after_step())]
        if sched is not None:
            wrap(sched, "step", after=lambda: rec._event(
                "scheduler_step", lr=opt.param_groups[0]["lr"]))

        self._hooks = [p.register_hook(self._grad_hook) for p in self.params]
        self._hooks.append(model.register_forward_pre_hook(eager(self._forward_hook)))
        self._patch_clip()

    def _patch_clip(self):
        """clip_grad_norm_ through the recorder (swap_clip)."""
        rec = self

        def make_clip(saved):
            def clip(*a, **k):
                # The gradient it clips must be the one backward left.
                if rec.snapshot is not None:
                    rec._check_unseen_change(rec._grads(), may_be_clip=False)
                norm = saved(*a, **k)
                rec._event("clip", grad_norm=float(norm))
                rec.snapshot = [g.clone() for g in rec._grads()]
                return norm
            return clip
        self._restore_clip = swap_clip(make_clip)

    def _unpatch(self):
        self._restore_clip()
        for h in self._hooks:
            h.remove()
        for h in self._step_hooks:
            h.remove()
        for obj, attr in ((self.optimizer, "zero_grad"),
                          (self.model, "zero_grad"), (self.scheduler, "step"),
                          (self.ema, "update_parameters")):
            if obj is not None and attr in obj.__dict__:
                del obj.__dict__[attr]

    # ---- hooks

    def _forward_hook(self, module, inputs):
        if not inputs or not torch.is_tensor(inputs[0]):
            return
        x = inputs[0]
        if not torch.is_grad_enabled():
            self.eval_forwards += 1
            return
        if torch.is_autocast_enabled("cpu"):
            self.autocast = str(torch.get_autocast_dtype("cpu")).replace("torch.", "")
        rows = int(x.shape[0]) if x.dim() > 0 else 1
        self.pending_rows += rows
        ids = self._ids_of(x) if x.dim() > 1 or self.bundle.kind != "token" else None
        if ids is None:
            self.pending_ids = None
        elif self.pending_ids is not None:
            self.pending_ids.extend(ids)

    def _grad_hook(self, grad):
        if not self.in_backward:
            self.in_backward = True
            self._begin_backward()
            at_backward_end(self._end_backward)
        return None

    def _begin_backward(self):
        # A gradient zeroed by hand since the last backward (p.grad = None,
        # p.grad.zero_()) is a zero_grad the recorder did not see called.
        if self.snapshot is not None and not self.zero_since_backward:
            now = [p.grad for p in self.params]
            zeroed = all(g is None or not bool(g.any()) for g in now)
            was = any(bool(s.any()) for s in self.snapshot)
            if zeroed and was:
                self._maybe_skipped(self.snapshot)
                self._event("zero_grad")
                self.notes.append("step %d: gradients zeroed without a zero_grad() call "
                                  "(seen from the values)" % self.steps)

    def _end_backward(self):
        self.in_backward = False
        ids = self.pending_ids
        samples = self.pending_rows
        if ids is not None:
            samples = len(ids)
            # A new epoch starts when a sample of this epoch is drawn again
            # after (nearly) every sample was drawn -- all but fewer than b,
            # what drop_last skips; an earlier repeat is a repeat.
            if self._new_epoch(ids):
                self.epoch += 1
                self.epoch_ids = set()
                self.epoch_micro = 0
            self.epoch_micro += 1
            self.epoch_ids.update(ids)
        self._event("forward_backward", samples=samples, ids=ids)
        scale = self._scale_fn() if self._scale_fn is not None else self._scale_now
        if scale is not None:
            self.scale = float(scale)
            self._state("loss_scale", self.steps, "", self.backwards, self.scale)
        self.backwards += 1
        self.since_step += 1
        self.pending_ids, self.pending_rows = [], 0
        self.zero_since_backward = False
        self.snapshot = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                         for p in self.params]
        self._progress(write=False)

    def _new_epoch(self, ids):
        """Whether the micro-batch `ids` starts a new epoch (see _end_backward)."""
        return self._covered() and any(i in self.epoch_ids for i in ids)

    def _grads(self):
        return [torch.zeros_like(p) if p.grad is None else p.grad.detach()
                for p in self.params]

    def _before_step(self):
        self.step_lr = float(self.optimizer.param_groups[0]["lr"])
        consumed = self._grads()
        if self.snapshot is not None:
            self._check_unseen_change(consumed)
        self._values("grad", consumed)

    def _check_unseen_change(self, consumed, may_be_clip=True):
        """The gradient about to be consumed (or clipped) against the one
        the last backward (or clip) left."""
        acc = self.snapshot
        if all(_same(a, c) for a, c in zip(acc, consumed)):
            return
        # The unscale (by the last backward's scale, or by the scaler's
        # current one when it changed since): not a clip.
        scales = {self.scale, self._scale_fn() if self._scale_fn is not None else None}
        for S in scales - {None, 1.0}:
            if all(_same(c, a / S) or _same(c, a * (1.0 / S))
                   for a, c in zip(acc, consumed)):
                self.snapshot = [c.clone() for c in consumed]
                return
        num = sum(float((a.double() * c.double()).sum()) for a, c in zip(acc, consumed))
        den = sum(float((a.double() ** 2).sum()) for a in acc)
        coef = num / den if den > 0 else 0.0
        scaled = den > 0 and all(
            torch.allclose(c.double(), coef * a.double(), rtol=1e-5, atol=1e-30)
            for a, c in zip(acc, consumed))
        norm = den ** 0.5
        if scaled and 0 < coef < 1 and may_be_clip:
            self._event("clip", grad_norm=norm)
            self.notes.append(
                "step %d: clip inferred from the values: the consumed gradient is %.9g x the "
                "accumulated one (norm %.9g); no clip_grad_norm_ call was seen"
                % (self.steps, coef, norm))
        else:
            self.unseen.append(
                "step %d: the gradient changed between the last backward and %s "
                "by something other than a clip_grad_norm_ the recorder saw%s"
                % (self.steps, "optimizer.step()" if may_be_clip else "clip_grad_norm_",
                   " (scaled by %.9g)" % coef if scaled else ""))

    def _after_step(self):
        self._event("optimizer_step", lr=self.step_lr)
        self.steps += 1
        self.since_step = 0
        self._values("param", self.params, step=self.steps - 1)
        self._record_state(self.steps - 1)
        self._progress(write=True)

    # ---- rows

    def _event(self, kind, samples=0, lr=float("nan"), grad_norm=float("nan"), ids=None):
        # micro: the backward's index within its window for forward_backward
        # (0-based, counted since the last optimizer step); -1 for the
        # window-level events (zero_grad, clip, optimizer_step,
        # scheduler_step), as accumcheck's own traces write them.
        if kind == "zero_grad":
            self.zero_since_backward = True
        micro = self.since_step if kind == "forward_backward" else -1
        self.events.append((self.run, self.epoch, self.steps, micro, kind, samples,
                            lr, grad_norm, ids))

    def _values(self, kind, tensors, step=None):
        step = self.steps if step is None else step
        self.values.add(self.run, step, kind,
                        [t.detach().reshape(-1).cpu().numpy() for t in tensors])

    def _event_rows(self):
        rows = []
        for run, epoch, step, micro, kind, samples, lr, gn, ids in self.events:
            rows.append("%s,%d,%d,%d,%s,%d,0,,%s,%s,%s\n" % (
                run, epoch, step, micro, kind, samples, real(lr), real(gn),
                " ".join(str(i) for i in ids) if ids else ""))
        return rows

    def close(self):
        """Restores the patched calls and writes the trace (atomically, the
        completion record complete.csv last).  Called while an exception
        propagates or is handled (a `with` block left by it, a `finally`,
        an `except`), it writes no trace: the run did not finish, and the
        folder's marker says so."""
        if self.closed:
            return
        if not self.abandoned:
            why = stopped_by()
            if why:
                self._abandon(why)
                return
        self.closed = True
        self._unpatch()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self.ambiguous_ids:
            self.unseen.append("%d input rows matched several samples with identical inputs: "
                               "their sample ids are a guess" % self.ambiguous_ids)
        if self.eval_forwards:
            self.notes.append("%d forward(s) under no_grad (evaluation): not micro-batches"
                              % self.eval_forwards)
        dtype = self.params[0].dtype
        precision = {torch.float32: "float32", torch.float64: "float64"}.get(dtype, str(dtype))
        meta = [("schema", TRACE_SCHEMA), ("scenario", self.bundle.scenario),
                ("scenario_digest", self.bundle.digest), ("engine", "pytorch"),
                ("precision", precision),
                ("tool_version", "accumcheck_torch-%s torch-%s" % (VERSION, torch.__version__)),
                ("recorder", "autograd gradient hooks, forward pre-hook, optimizer.step, "
                             "clip_grad_norm_ code")]
        if self.notes:
            meta.append(("notes", " | ".join(self.notes)))
        if self.autocast:
            meta.append(("autocast", self.autocast))
        if self.ema is not None:
            meta.append(("ema_decay", real(self.ema_decay)))
        meta += unseen_meta(self.unseen)
        import os
        extra = {}
        if self.state_rows:
            extra["state.csv"] = STATE_HEADER + "\n" + "".join(self.state_rows)
        elif os.path.exists(os.path.join(self.out, "state.csv")):
            os.unlink(os.path.join(self.out, "state.csv"))  # an earlier trace's
        self._write(meta, self._event_rows(), self.values, extra)
        self._recording.done()

    def _write(self, meta, events, values, extra):
        """Writes the trace (a DistributedRecorder gathers every rank's part
        first: accumcheck_torch/distributed.py)."""
        write_trace(self.out, meta, events, values, extra)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
