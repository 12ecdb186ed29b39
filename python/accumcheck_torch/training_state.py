"""The oracle-tier Recorder's training state beyond gradients, state.csv
(verify/trace/trace.hpp describes its rows): each backward's loss scale
and the skipped windows, the optimizer's state after every step (its
moments as values.bin blocks where it can), BatchNorm's running
statistics, an EMA's updates and the logged loss (a mixin of Recorder)."""

import torch

from .trace import real

STATE_HEADER = "run,kind,step,tensor,index,value"


class TrainingState:
    def loss_scale(self, scale):
        """Tells the recorder the loss scale of the following backward passes
        (instead of Recorder(loss_scale=callable))."""
        self._scale_now = float(scale)

    def log_loss(self, value):
        """Records the loss the trainer logs for the current window (or, right
        after an optimizer step, for the window that step closed)."""
        window = self.steps if self.since_step > 0 else self.steps - 1
        self._state("logged_loss", max(window, 0), "", 0, float(value))

    def _state(self, kind, step, tensor, index, value):
        self.state_rows.append("%s,%s,%d,%s,%d,%s\n"
                               % (self.run, kind, step, tensor, index, real(value)))

    def _state_tensor(self, kind, step, name, t):
        for i, v in enumerate(t.detach().reshape(-1).double().tolist()):
            self._state(kind, step, name, i, v)

    def _batchnorms(self):
        """(module, the scenario's buffer prefix) of each BatchNorm, by order."""
        norm = torch.nn.modules.batchnorm._BatchNorm
        mine = [m for m in self.model.modules() if isinstance(m, norm)]
        if not mine:
            return []
        theirs = [n for n, m in self.bundle.model().named_modules() if isinstance(m, norm)]
        if len(theirs) != len(mine):
            self.notes.append("%d BatchNorm modules, the scenario has %d: their running "
                              "statistics are not recorded" % (len(mine), len(theirs)))
            return []
        return list(zip(mine, theirs))

    def _maybe_skipped(self, grads):
        """A window zeroed without an optimizer step whose gradients hold
        inf/NaN: the loss scaler's skipped step."""
        if self.since_step > 0 and any(not bool(torch.isfinite(g).all()) for g in grads):
            self._state("skipped", self.steps, "", self.backwards,
                        self.scale if self.scale is not None else float("nan"))
            self.since_step = 0
            self.snapshot = None

    def _record_state(self, step):
        states = [self.optimizer.state.get(p, {}) for p in self.params]
        for name, st in zip(self.names, states):
            if "step" in st:
                self._state("opt_step", step, name, 0, float(st["step"]))
        for kind in ("exp_avg", "exp_avg_sq"):
            # values.bin blocks when every parameter has the moment (a
            # 1M-parameter model's moments as state.csv rows would be GBs).
            if any(kind in st for st in states) and not self.values.add_state(
                    self.run, step, kind, [st.get(kind) for st in states]):
                for name, st in zip(self.names, states):
                    if kind in st:
                        self._state_tensor(kind, step, name, st[kind])
        for m, prefix in self._bn:
            for kind in ("running_mean", "running_var", "num_batches_tracked"):
                buf = getattr(m, kind, None)
                if buf is not None:
                    self._state_tensor(kind, step, "%s.%s" % (prefix, kind), buf)

    def _after_ema(self):
        self._state("ema_update", self.ema_updates, "", self.steps, self.since_step)
        mine = dict(self.ema.module.named_parameters())
        averaged = [mine[self.mapping[name][0]] for name in self.names]
        if not self.values.add_state(self.run, self.ema_updates, "ema", averaged):
            for name, t in zip(self.names, averaged):
                self._state_tensor("ema", self.ema_updates, name, t)
        self.ema_updates += 1
