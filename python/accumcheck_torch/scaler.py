"""A window the loss scaler skips, recorded for certify (ContractRecorder's
scaler part).

torch.amp.GradScaler.step(optimizer) unscales the window's gradient and,
where it holds inf or NaN (found_inf), does not update: a plain
optimizer's step() is not called at all, a fused one's is called with
found_inf set and updates nothing; scaler.update() then multiplies the
scale by its backoff factor (0.5).  While a ContractRecorder records,
GradScaler.step and .update (the class's, so every scaler and every name
bound to them) go through it for the recorder's optimizer:

  - the window's step index is spent, as correct accumulation spends it
    (the next window is step t + 1 of the same plan), and contract.csv
    gets an `overflow` row in place of its `step` row: the backward passes
    of the window, how many of them hold inf or NaN (a window that
    overflowed by itself has one; none: the inf came from a gradient left
    in .grad by an earlier skipped window), how many of the sampled
    parameters' and optimizer state's coordinates (and scalar state) the
    skipped step changed (0), and the scale before the step, after
    update() and the scaler's backoff factor;
  - an optimizer step whose consumed gradient holds inf or NaN (a loop
    that steps anyway: optimizer.step() past the scaler) is an `overflow`
    row too, not skipped.

certify judges both (its `loss scaler` check); the window's backward
passes are in no step, the next windows are fitted and judged as before.
"""

import functools

import torch

from .guard import _never_raises
from .trace import real

# The GradScaler methods routed through the live recorder (name -> PyTorch's).
_SAVED = {}


def _scaler_class():
    return getattr(getattr(torch, "amp", None), "GradScaler", None)


class Scaler:
    """The loss scaler's skipped windows (a mixin of ContractRecorder)."""

    def _patch_scaler(self):
        self.skip = None           # the skip being recorded: its row's fields
        self.overflowed = False    # this step consumed inf/NaN (stepped anyway)
        cls = _scaler_class()
        if cls is None or _SAVED:
            return
        rec = self
        step, update = cls.step, cls.update

        @functools.wraps(step)
        def scaler_step(scaler, optimizer, *a, **k):
            if optimizer is not rec.optimizer or rec.closed or not scaler.is_enabled():
                return step(scaler, optimizer, *a, **k)
            before = rec._scaler_before(scaler)
            out = step(scaler, optimizer, *a, **k)
            rec._scaler_after(scaler, optimizer, before)
            return out

        @functools.wraps(update)
        def scaler_update(scaler, *a, **k):
            out = update(scaler, *a, **k)
            if rec.skip is not None and not rec.closed:
                rec._skip_scale(scaler)
            return out
        _SAVED.update(step=step, update=update)
        cls.step, cls.update = scaler_step, scaler_update

    def _unpatch_scaler(self):
        cls = _scaler_class()
        if _SAVED and cls is not None:
            cls.step, cls.update = _SAVED["step"], _SAVED["update"]
            _SAVED.clear()
        self._flush_skip()

    def _sampled_state(self):
        """(parameter, state key) -> float64 values: the parameters' and
        every optimizer state tensor's sampled coordinates (a state not
        shaped like its parameter whole), and scalar state."""
        out = {}
        with torch.no_grad():
            for i, p in enumerate(self.params):
                q = self._local(p)
                out[(i, None)] = self._state_take(i, q, q).double().clone()
                for k, v in self.optimizer.state.get(p, {}).items():
                    if torch.is_tensor(v):
                        v = self._local(v)
                        v = self._state_take(i, q, v) if v.shape == q.shape else v.reshape(-1)
                        out[(i, k)] = v.detach().double().reshape(-1).clone()
                    elif isinstance(v, (int, float)):
                        out[(i, k)] = torch.tensor([float(v)], dtype=torch.float64)
        return out

    @staticmethod
    def _changed(was, now):
        """How many values differ (NaN equal to NaN); a state made by the
        step (an optimizer's lazy initialisation) counts its nonzero
        values, a state removed all of its values."""
        n = 0
        for key in set(was) | set(now):
            a, b = was.get(key), now.get(key)
            if a is None or b is None:
                n += int(((a if b is None else b) != 0).sum())
            elif a.shape != b.shape:
                n += max(a.numel(), b.numel())
            else:
                n += int((~((a == b) | (torch.isnan(a) & torch.isnan(b)))).sum())
        return n

    def _state_take(self, i, q, t):
        """Parameter i's coordinates of t, shaped like q (as the optimizer
        steps it)."""
        if q.shape == self.params[i].shape:
            return self.buf.take(i, t)
        return t.reshape(-1)

    @_never_raises
    def _scaler_before(self, scaler):
        return float(scaler.get_scale()), self._sampled_state()

    @_never_raises
    def _scaler_after(self, scaler, optimizer, before):
        state = scaler._per_optimizer_states.get(id(optimizer), {})
        found = sum(float(v) for v in state.get("found_inf_per_device", {}).values())
        if not found or before is None:
            return
        scale, was = before
        self._recompute_pending()
        changed = self._changed(was, self._sampled_state())
        own = sum(1 for b in self.since_step
                  if not bool(torch.isfinite(self.buf.m[self.backwards[b][2]]).all()))
        backoff = getattr(scaler, "get_backoff_factor", lambda: float("nan"))()
        self.skip = [self.steps, len(self.since_step), own, changed, scale, float("nan"),
                     float(backoff)]
        self._window_spent(float(self.optimizer.param_groups[0]["lr"]))

    @_never_raises
    def _skip_scale(self, scaler):
        self.skip[5] = float(scaler.get_scale())
        self._flush_skip()

    def _flush_skip(self):
        """The skipped window's row, once its scale after update() is known
        (or the next step, or close(), comes first: nan)."""
        s, self.skip = self.skip, None
        if s is not None:
            self._overflow_row(s[0], s[1], True, s[2], s[3], s[4], s[5], s[6])

    def _overflow_row(self, t, passes, skipped, own, changed, before, after, backoff):
        self.rows.append("overflow,%d,%d,,%d,%d,%d,%s,%s,%s\n" % (
            t, passes, int(skipped), own, changed, real(before), real(after), real(backoff)))

    def _overflow_stepped(self, lr):
        """optimizer.step() on a gradient holding inf or NaN (no scaler
        skipped it): recorded, never replayed."""
        own = sum(1 for b in self.since_step
                  if not bool(torch.isfinite(self.buf.m[self.backwards[b][2]]).all()))
        nan = float("nan")
        self._overflow_row(self.steps, len(self.since_step), False, own, -1, nan, nan, nan)
        self.overflowed = True
        self.events.append(("optimizer_step", self.steps, -1, lr))

    def _window_spent(self, lr):
        """The window's step index spent without a fit (skipped, or stepped
        on inf/NaN): its backward passes are in no step; the next step is
        fitted without the previous step's gradient."""
        if self.skip is not None:
            self.events.append(("optimizer_step", self.steps, -1, lr))
        self.steps += 1
        for b in self.since_step:
            self.backwards[b][2] = None
        self.since_step = []
        self.has_prev = False
        self._progress(write=True)
