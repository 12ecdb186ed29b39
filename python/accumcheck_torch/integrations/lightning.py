"""Lightning integration: a Callback that records the contract-tier trace of
a real `Trainer.fit` (accumcheck certify --contract judges it).

    from accumcheck_torch.integrations.lightning import AccumcheckCallback
    trainer = Trainer(callbacks=[AccumcheckCallback(out="trace/")],
                      accumulate_grad_batches=K, ...)
    trainer.fit(module, loader)          # your LightningModule, unchanged
    accumcheck certify --contract --trace trace/

What it is judged against comes from what you configured: K =
`accumulate_grad_batches`, the clip = `gradient_clip_val` (norm clipping),
the lr = the optimizer's lr at the start (or `lr=`: the base lr you
meant, so an `lr * K` written into the optimizer before its scheduler was
built shows), the schedule = what you declare: `schedule="trainer"` (the
scheduler configure_optimizers returns, stepped as its config's
`interval` and `frequency` say, frequency counted in optimizer steps
across epochs), a scheduler factory, lr_lambda or a
{"scheduler": ..., "interval": "step" | "epoch", "frequency": n} config
around one (_common.declaration, schedule.Cadence), or a named kind
(`schedule="linear" | "cosine" | "constant"`, `warmup=` optimizer steps;
its horizon computed by accumcheck from max_epochs or max_steps, the
loader's length and K: _common.Semantics); a scheduler in
configure_optimizers without `schedule=` is refused before training
starts.  Nothing is taken from a value Lightning derives.  Lightning divides every
micro-batch's loss by K, the epoch's short last window included (#19987):
certify names that `partial-cycle-scale-by-k` (with a mean loss over
unequal item counts, `token-mean-of-means` or its pair); `accept=[...]`
accepts a pitfall id as your loop, and certify then says "accepted: ...".

Under DDP (Trainer(devices=R, strategy="ddp" | "ddp_spawn" | "ddp_fork"),
gloo on CPU) every rank runs the callback and records its own
micro-batches with ContractDistributedRecorder: the ranks gather their
backward passes at each optimizer step, DDP's forward says which backward
all-reduces (Lightning's no_sync on the accumulating micro-batches), and
rank 0 writes the one trace (the rank column).  The world size judged is
the configured one (devices x num_nodes, checked against the process
group); each epoch is the rank's DistributedSampler share.  Other
multi-device strategies (FSDP, DeepSpeed) are refused.

The loss: for standard heads (a batch dict with "labels" or an (x, y) pair;
(B, T) labels: shifted token cross-entropy with ignore_index -100; (B,)
labels: per-sample cross-entropy; _common.standard_head_of; head= says it
outright) the summed item loss and its item count are derived; pass loss_fn(model, batch) -> summed item loss and
count_fn(batch) -> items for anything else.  The module the recorder
watches is your LightningModule (its forward); a training_step that calls
an inner module directly gets its g_j from a recompute on a copy."""

import multiprocessing
import sys

import torch.distributed as dist

from . import _common
from ..trace import Refused

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl


def _raw(optimizer):
    """The torch optimizer under Lightning's LightningOptimizer."""
    return getattr(optimizer, "_optimizer", optimizer)


REFUSED_LINE = "\n%s.%s: " % (Refused.__module__, Refused.__qualname__)


def _in_spawned_rank():
    """Whether this process is a rank torch.multiprocessing started
    (strategy="ddp_spawn", "ddp_fork"): Lightning runs the fit there
    without its exception handling (no on_exception hook), and torch's
    wrapper turns any Exception into exit 1 with its traceback."""
    return multiprocessing.parent_process() is not None


def _refusing(hook):
    """A callback hook that, in a rank torch.multiprocessing started, ends
    the rank with exit code 2 and the refusal's message (no traceback), as
    a refused script does; its launcher then exits 2 too (on_exception)."""
    def wrapped(self, *args, **kwargs):
        try:
            return hook(self, *args, **kwargs)
        except Refused as e:
            if not _in_spawned_rank():
                raise
            if self.recorder is not None and not self.recorder.closed:
                # No trace: its marker says why.
                self.recorder._abandon("the recorder refused: " + e.message, say=False)
            sys.stderr.write("accumcheck_torch: %s\n" % e.message)
            sys.stderr.flush()
            raise SystemExit(2) from None
    wrapped.__name__, wrapped.__doc__ = hook.__name__, hook.__doc__
    return wrapped


class AccumcheckCallback(pl.Callback):
    """AccumcheckCallback(out="trace", loss_fn=None, count_fn=None,
    items=None, head=None, lr=None, schedule=None, warmup=0, accept=(),
    quiet=True, calibrate_every=None)."""

    def __init__(self, out="trace", loss_fn=None, count_fn=None, items=None, head=None, lr=None,
                 schedule=None, warmup=0, accept=(), quiet=True, calibrate_every=None):
        super().__init__()
        if (loss_fn is None) != (count_fn is None):
            raise Refused("pass both loss_fn=(model, batch) -> summed item loss and "
                          "count_fn=(batch) -> items, or neither (standard heads)")
        self.out, self.loss_fn, self.count_fn, self.items = out, loss_fn, count_fn, items
        self.head, self.lr, self.schedule, self.warmup = head, lr, schedule, warmup
        self.accept = _common.accepted(accept)
        self.quiet, self.calibrate_every = quiet, calibrate_every
        self.recorder = None

    # ---- the configuration (before the first batch)

    @_refusing
    def on_train_start(self, trainer, pl_module):
        if not pl_module.automatic_optimization:
            raise Refused("manual optimization: record your own loop with ContractRecorder "
                          "(accumcheck_torch.ContractRecorder) instead of the callback")
        self.ddp = self._ddp(trainer) if self._world(trainer) > 1 else None
        if len(trainer.optimizers) != 1:
            raise Refused("%d optimizers: the callback records exactly one"
                          % len(trainer.optimizers))
        schedule = self.schedule
        if isinstance(schedule, str) and schedule == "trainer":
            configs = trainer.lr_scheduler_configs
            if len(configs) != 1:
                raise Refused("schedule='trainer': configure_optimizers returns %d lr schedulers, "
                              "the callback declares exactly one" % len(configs))
            schedule = configs[0]
        elif trainer.lr_scheduler_configs and schedule is None:
            raise Refused("configure_optimizers returns an lr scheduler: declare the schedule it "
                          "is meant to follow: AccumcheckCallback(schedule='trainer') (that "
                          "scheduler with its interval and frequency; lr= the base lr you meant "
                          "the optimizer to have), a scheduler factory or lr_lambda (stepped "
                          "every optimizer step; in a {'scheduler': ..., 'interval': 'step' | "
                          "'epoch', 'frequency': n} config for another cadence), or "
                          "schedule='linear' | 'cosine' | 'constant' with warmup=optimizer steps")
        clip = trainer.gradient_clip_val or None
        if clip is not None and trainer.gradient_clip_algorithm not in (None, "norm"):
            raise Refused("gradient_clip_algorithm=%r: the contract tier judges norm clipping "
                          "only" % trainer.gradient_clip_algorithm)
        loader = trainer.train_dataloader
        try:
            dataset = len(loader.dataset)
        except TypeError:
            raise Refused("the training set has no len(): the callback records map-style "
                          "datasets") from None
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        self.sem = _common.Semantics(
            accumulation=trainer.accumulate_grad_batches, micro_batch=loader.batch_size,
            dataset=dataset, epochs=trainer.max_epochs if max_steps is None else None,
            max_steps=max_steps, world=self._world(trainer),
            drop_last=bool(getattr(loader, "drop_last", False)), lr=self.lr,
            schedule=schedule, warmup=self.warmup, clip=clip)
        self.trainer_model = pl_module
        self.optimizer = _raw(trainer.optimizers[0])

    @staticmethod
    def _world(trainer):
        """The world size as configured: Trainer(devices=, num_nodes=)."""
        return trainer.num_nodes * trainer.num_devices

    def _ddp(self, trainer):
        """The DistributedDataParallel module of a DDP strategy ("ddp",
        "ddp_spawn", "ddp_fork": each rank runs this callback), after
        checking the process group is the configured world."""
        from torch.nn.parallel import DistributedDataParallel

        world = self._world(trainer)
        ddp = getattr(trainer.strategy, "model", None)
        if not isinstance(ddp, DistributedDataParallel):
            raise Refused("strategy %s at %d devices: the callback records DDP (strategy='ddp', "
                          "'ddp_spawn' or 'ddp_fork'); for FSDP or DeepSpeed record your own loop "
                          "(accumcheck_torch.fsdp.ContractFSDPRecorder)"
                          % (type(trainer.strategy).__name__, world))
        if not dist.is_initialized() or dist.get_world_size() != world:
            raise Refused("Trainer(devices=%d, num_nodes=%d) configures %d processes, but the "
                          "process group has %s: launch one process per device"
                          % (trainer.num_devices, trainer.num_nodes, world,
                             dist.get_world_size() if dist.is_initialized() else "none"))
        return ddp

    def _start(self, pl_module, batch):
        """The recorder, built at the first batch (whose labels say which
        items the standard head counts)."""
        if self.loss_fn is not None:
            loss_fn, count_fn, items = self.loss_fn, self.count_fn, self.items or "samples"
        else:
            loss_fn, count_fn, items = _common.standard_head_of(pl_module, batch, self.head)
        # Under DDP every rank records its own micro-batches; the watched
        # module is the LightningModule (its forward), DDP's forward says
        # which backward all-reduces (Lightning's no_sync under accumulation).
        self.recorder = _common.recorder(
            pl_module, self.optimizer, loss_fn, count_fn, self.sem.world, ddp=self.ddp,
            out=self.out, items=items, quiet=self.quiet, accept=self.accept,
            calibrate_every=self.calibrate_every, **self.sem.recorder_kwargs())

    # ---- the run

    def on_train_epoch_start(self, trainer, pl_module):
        self._loader = trainer.train_dataloader
        self._epoch_pending = True

    @_refusing
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.recorder is None:
            self._start(pl_module, batch)
        if self._epoch_pending:
            self.recorder._new_epoch(self._loader)
            self._epoch_pending = False
        self.recorder._drawn(batch)

    @_refusing
    def on_train_end(self, trainer, pl_module):
        if self.recorder is None:
            raise Refused("the run drew no batch: nothing to certify (check max_steps, "
                          "limit_train_batches and the dataloader)")
        if not self.recorder.steps:
            # Refused by the recorder: it ends without a trace, its marker
            # saying why.
            self.recorder._refuse("the run never stepped the optimizer (%d micro-batches, "
                                  "accumulate_grad_batches=%d): nothing to certify"
                                  % (len(self.recorder.micro), self.sem.K))
        self.recorder.close()

    def on_exception(self, trainer, pl_module, exception):
        if self.recorder is not None and not self.recorder.closed:
            self.recorder.close()  # the run did not finish: no trace, its marker says why
        # strategy="ddp_spawn", "ddp_fork": a rank this callback refused in
        # (exit 2, its message printed there: _refusing) reaches the
        # launching process as torch.multiprocessing's
        # ProcessExitedException; that process exits 2 too, not 1.
        name = type(exception).__name__
        if getattr(exception, "exit_code", None) == 2 and name == "ProcessExitedException":
            raise Refused("rank %s refused (exit 2): what to pass is in its message above"
                          % getattr(exception, "error_index", "?")) from None
        # A refusal raised in a rank outside the callback's hooks (the
        # recorder's, inside your forward or backward) reaches it as
        # ProcessRaisedException, whose message is the rank's traceback:
        # its last exception, when a Refused, is the message to give.
        at = str(exception).rfind(REFUSED_LINE) if name == "ProcessRaisedException" else -1
        if at >= 0:
            raise Refused("rank %s: %s" % (getattr(exception, "error_index", "?"),
                                           str(exception)[at + len(REFUSED_LINE):].rstrip())) \
                from None
