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
    judged)."""

    def __init__(self, declared, optimizer, K):
        from torch.optim.lr_scheduler import LambdaLR, LRScheduler
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

    def _proxy(self, fresh):
        """An optimizer of your optimizer's class over one stand-in
        parameter per group, with your groups' hyperparameters (fresh: as
        before any scheduler: lr its initial_lr)."""
        groups = []
        for g in self.groups:
            h = copy.deepcopy(g)
            if fresh and "initial_lr" in h:
                h["lr"] = h.pop("initial_lr")
            groups.append(dict(h, params=[torch.zeros(1, requires_grad=True)]))
        try:
            return self.cls(groups)
        except Exception:  # noqa: BLE001 -- a class that needs more arguments
            return torch.optim.SGD(groups)

    def table(self, rows, scale):
        """The group-0 lr after 0 .. rows-1 scheduler.step() calls (fewer
        where the scheduler refuses to step further, as OneCycleLR past
        its total_steps)."""
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
