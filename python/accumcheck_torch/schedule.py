"""A declared lr schedule in the form the user has it (a scheduler object,
an lr_lambda, a factory), tabulated by the contract tier's recorder into
schedule.csv: the lr of every scheduler call, in double as PyTorch computes
it, from the recorder's own copy (never the user's scheduler or
optimizer); certify's lr channel judges each candidate against it
(docs/tiers.md, docs/trace-format.md)."""

import copy

import torch

from .trace import Refused, real

SCHEDULE_HEADER = "calls,lr,lr_stretched"


class Schedule:
    """A declared lr schedule in the form the user has it, tabulated on the
    recorder's own copy (never the user's scheduler or optimizer): the
    group-0 lr after n scheduler.step() calls, stepped by PyTorch itself
    (so in double, exactly as the trainer's scheduler computes it).

    declared: a torch.optim.lr_scheduler.LRScheduler object (a framework's
    too, e.g. the LambdaLR transformers.get_linear_schedule_with_warmup
    returns), not yet stepped; an lr_lambda (step -> factor, as LambdaLR
    takes it); a factory optimizer -> scheduler; or a factory (optimizer,
    scale) -> scheduler whose every length (warmup, horizon, step size) is
    multiplied by scale: the recorder builds it with scale 1 (the accepted
    schedule) and K (schedule-horizon-in-micro-steps, otherwise not
    judged); or any of these in a Cadence (stepped every f optimizer
    steps or every f epochs, as Lightning's lr_scheduler config says).

    lr: the base lr you meant the optimizer to be built with (group 0's;
    every group scaled by the same ratio), when the optimizer holds
    another (an `lr * K` written into it before the scheduler was built):
    the table is the scheduler's as if built over an optimizer at that lr.
    None: the optimizer's own."""

    def __init__(self, declared, optimizer, K, lr=None):
        from torch.optim.lr_scheduler import LambdaLR, LRScheduler
        self.cadence = None
        if isinstance(declared, Cadence):
            self.cadence, declared = declared, declared.declared
        # A wrapper (Accelerate's AcceleratedOptimizer / Scheduler) holds
        # the torch optimizer or scheduler as .optimizer / .scheduler.
        inner = getattr(optimizer, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer):
            optimizer = inner
        inner = getattr(declared, "scheduler", None)
        if not isinstance(declared, LRScheduler) and isinstance(inner, LRScheduler):
            declared = inner
        self.cls, self.K, self.rebuild = type(optimizer), K, None
        # Your groups' hyperparameters now (before training moves them).
        self.groups = [copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                       for g in optimizer.param_groups]
        # The stated base lr: every lr of the groups (as before any
        # scheduler: initial_lr where one is built) scaled by lr / group 0's.
        self.ratio = 1.0
        if lr is not None:
            g0 = self.groups[0]
            base = float(g0.get("initial_lr", g0["lr"]))
            if not lr > 0 or base <= 0:
                raise Refused("schedule: lr=%r with an optimizer whose group-0 lr is %r: expected "
                              "both > 0 (lr: the base lr you meant the optimizer to have)"
                              % (lr, base))
            self.ratio = float(lr) / base
        if isinstance(declared, LRScheduler):
            if declared.optimizer is not optimizer and \
                    getattr(declared.optimizer, "optimizer", None) is not optimizer:
                raise Refused("schedule: the scheduler object wraps another optimizer than the "
                              "recorder's")
            if declared.last_epoch != 0:
                raise Refused("schedule: the scheduler object was stepped %d times already; make "
                              "the recorder before the first scheduler.step()"
                              % declared.last_epoch)
            # Its copy now: the scheduler with the recorder's own optimizer
            # in place of yours (its state and lr as the scheduler left
            # them); each table steps a copy of that copy.
            snapshot = copy.deepcopy(declared, {id(declared.optimizer): self._proxy(fresh=False)})
            if self.ratio != 1.0:
                self._rescale(snapshot)
            self.build = lambda scale: copy.deepcopy(snapshot)
            self.what = "a %s object" % type(declared).__name__
        elif callable(declared):
            factor = None
            try:
                factor = declared(0)
            except Exception:  # noqa: BLE001 -- not an lr_lambda: a factory
                pass
            if isinstance(factor, (int, float)) and not isinstance(factor, bool):
                self.build = lambda scale: LambdaLR(self._proxy(fresh=True), declared)
                self.what = "an lr_lambda"
            else:
                import inspect
                try:
                    two = len(inspect.signature(declared).parameters) >= 2
                except (TypeError, ValueError):
                    two = False
                if two:
                    self.build = lambda scale: declared(self._proxy(fresh=True), scale)
                    self.rebuild = K
                    self.what = "a factory of (optimizer, scale)"
                else:
                    self.build = lambda scale: declared(self._proxy(fresh=True))
                    self.what = "a factory of the optimizer"
        else:
            raise Refused("schedule: expected a dict of a named kind, an LRScheduler object, an "
                          "lr_lambda (step -> factor) or a factory (optimizer [, scale]) -> "
                          "scheduler, got %r" % (declared,))
        first = self.build(1)
        if not isinstance(first, LRScheduler):
            raise Refused("schedule: %s returned %r, expected a torch.optim.lr_scheduler "
                          "scheduler" % (self.what, first))

    def _rescale(self, sched):
        """The snapshot of a scheduler object as if it had been built over
        an optimizer at the stated lr: every lr it derived from the
        optimizer's (the groups' lr and initial_lr, its base_lrs and last
        lrs, those of the schedulers it chains) times the ratio; what it
        holds in absolute terms (CosineAnnealingLR's eta_min) stays."""
        from torch.optim.lr_scheduler import CyclicLR, OneCycleLR
        if isinstance(sched, (OneCycleLR, CyclicLR)):
            raise Refused("schedule: a %s sets the lr from its own max_lr / base_lr arguments "
                          "and never reads the optimizer's, so an lr written into the optimizer "
                          "before it is overwritten: lr= has nothing to state; give the lr in "
                          "the scheduler's arguments" % type(sched).__name__)
        r = self.ratio
        for g in sched.optimizer.param_groups:
            for k in ("lr", "initial_lr"):
                if k in g:
                    g[k] = g[k] * r
        seen = set()

        def scale(s):
            if id(s) in seen:
                return
            seen.add(id(s))
            for k in ("base_lrs", "_last_lr"):
                if isinstance(getattr(s, k, None), list):
                    setattr(s, k, [x * r for x in getattr(s, k)])
            for child in getattr(s, "_schedulers", ()):
                scale(child)
        scale(sched)

    def _proxy(self, fresh):
        """An optimizer of your optimizer's class over one stand-in
        parameter per group, with your groups' hyperparameters (fresh: as
        before any scheduler: lr its initial_lr, times the stated lr's
        ratio)."""
        groups = []
        for g in self.groups:
            h = copy.deepcopy(g)
            if fresh and "initial_lr" in h:
                h["lr"] = h.pop("initial_lr")
            if fresh:
                h["lr"] = h["lr"] * self.ratio
            groups.append(dict(h, params=[torch.zeros(1, requires_grad=True)]))
        try:
            return self.cls(groups)
        except Exception:  # noqa: BLE001 -- a class that needs more arguments
            return torch.optim.SGD(groups)

    @property
    def frequency(self):
        """The optimizer steps between two scheduler.step() calls (a
        Cadence of interval "step"; 1 otherwise): meta.csv's
        schedule_frequency, certify stepping the table's calls as it
        says (and scheduler-frequency-in-micro-batches as that does)."""
        c = self.cadence
        return c.frequency if c is not None and c.interval == "step" else 1

    def table(self, rows, scale):
        """The group-0 lr after 0 .. rows-1 scheduler.step() calls (fewer
        where the scheduler refuses to step further, as OneCycleLR past
        its total_steps); under a Cadence of interval "epoch", after 0 ..
        rows-1 optimizer steps (the scheduler stepped as the cadence
        says).  A Cadence of interval "step" keeps the table in calls:
        when they come is the loop's (its frequency, certify's rule)."""
        if self.cadence is None or self.cadence.interval == "step":
            return self._calls(rows, scale)
        calls = [self.cadence.calls(n) for n in range(rows)]
        lr = self._calls(calls[-1] + 1, scale)
        return [lr[c] for c in calls if c < len(lr)]

    def _calls(self, rows, scale):
        import warnings
        sched = self.build(scale)
        out = [float(sched.optimizer.param_groups[0]["lr"])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(rows - 1):
                try:
                    sched.step()
                except (ValueError, IndexError, ZeroDivisionError):
                    break
                out.append(float(sched.optimizer.param_groups[0]["lr"]))
        return out

    def csv(self, rows):
        lr = self.table(rows, 1)
        st = self.table(rows, self.rebuild) if self.rebuild else []
        n = min(len(lr), len(st)) if st else len(lr)
        return SCHEDULE_HEADER + "\n" + "".join(
            "%d,%s,%s\n" % (i, real(lr[i]), real(st[i]) if st else "") for i in range(n))


class Cadence:
    """A scheduler declaration (any form Schedule takes) stepped every
    `frequency` optimizer steps (interval="step") or every `frequency`
    epochs (interval="epoch", an epoch being `steps_per_epoch` optimizer
    steps), as Lightning's lr_scheduler config {"scheduler", "interval",
    "frequency"} says it: the lr of optimizer step n is the scheduler's
    after calls(n) scheduler.step() calls.  The steps are counted across
    epochs (a frequency of 3 steps over epochs of 2 steps still steps
    every 3).  Of interval "step" the table stays in calls and meta.csv
    says the frequency (Schedule.frequency): certify steps it so, and
    judges scheduler-frequency-in-micro-batches (Lightning's
    `(batch_idx + 1) % frequency` at a window's end) against it too."""

    def __init__(self, declared, interval="step", frequency=1, steps_per_epoch=None):
        if interval not in ("step", "epoch"):
            raise Refused("schedule: interval %r: expected 'step' or 'epoch'" % (interval,))
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise Refused("schedule: frequency %r: expected a whole number >= 1" % (frequency,))
        if interval == "epoch" and (steps_per_epoch is None or steps_per_epoch < 1):
            raise Refused("schedule: interval 'epoch' needs the optimizer steps of an epoch")
        if isinstance(declared, Cadence):
            raise Refused("schedule: a cadence of a cadence")
        self.declared, self.interval, self.frequency = declared, interval, frequency
        self.steps_per_epoch = steps_per_epoch

    def calls(self, n):
        """scheduler.step() calls before optimizer step n (0-based): the
        scheduler steps after every frequency-th step (or epoch)."""
        if self.interval == "epoch":
            return (n // self.steps_per_epoch) // self.frequency
        return n // self.frequency

    def __repr__(self):
        return "Cadence(%r, interval=%r, frequency=%d)" % (self.declared, self.interval,
                                                           self.frequency)
