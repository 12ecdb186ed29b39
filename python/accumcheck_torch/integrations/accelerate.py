"""Accelerate integration: records the contract-tier trace of a real
Accelerate loop (accumcheck certify --contract judges it).

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    rec = record(accelerator, model, optimizer, loader, scheduler, out="trace/",
                 epochs=3, schedule="linear", warmup=10)
    for batch in loader:                       # your loop, unchanged
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
    rec.close()
    accumcheck certify --contract --trace trace/

record() watches the prepared loader in place (each iteration over it is
an epoch), the prepared model's forwards and the optimizer under
Accelerate's AcceleratedOptimizer; nothing in the loop changes.

What it is judged against comes from what you configured: K =
`Accelerator(gradient_accumulation_steps=K)`, the lr = the optimizer's
initial lr (or `lr=`: the base lr you meant, so an `lr * K` written into
the optimizer shows), the schedule = what you declare: the scheduler as
your loop has it (`schedule=scheduler`, any torch.optim.lr_scheduler
scheduler not yet stepped: StepLR, MultiStepLR, LambdaLR, OneCycleLR,
what transformers.get_*_schedule_with_warmup returns; an lr_lambda; a
factory of the optimizer: the forms of ContractRecorder(schedule=),
tabulated by schedule.Schedule on its own copy) or a named kind
(`schedule="linear" | "cosine" | "constant"`, `warmup=` optimizer steps;
its horizon computed by accumcheck from `epochs=` or `max_steps=`, the
loader and K: _common.Semantics); a scheduler passed without `schedule=`
is refused; the clip = `clip=` (the
max_norm you pass to accelerator.clip_grad_norm_), never a value
Accelerate derives.  `accelerator.backward` divides every micro-batch's
loss by K, the short window at the end of the loader included (its
gradient_state syncs there): certify names what that does to your
weights (partial-cycle-scale-by-k, token-mean-of-means for a token mean
over unequal counts); `accept=[...]` accepts a pitfall id as your loop.

The loss: standard heads are derived (_common.standard_head_of: a batch
dict with "labels" or an (x, y) pair; (B, T) labels: shifted token
cross-entropy with ignore_index -100; (B,) labels: per-sample
cross-entropy; head= says it outright); pass loss_fn(model, batch) -> summed item loss and
count_fn(batch) -> items for anything else."""

import accelerate  # noqa: F401 -- the framework this module integrates

from . import _common
from ..trace import Refused, stopped_by


def _set_class(obj, cls):
    object.__dict__["__class__"].__set__(obj, cls)


class _Shard:
    """This rank's share of a prepared loader, as the distributed recorder
    reads an epoch (len(sampler) samples, batch_size): Accelerate hands
    each rank len(loader) batches of batch_size (even_batches, its default,
    fills the last ones from the start)."""

    def __init__(self, loader):
        bs = getattr(loader, "batch_size", None) or getattr(loader.batch_sampler, "batch_size", 1)
        self.batch_size = bs
        self.sampler = self.dataset = range(len(loader) * bs)


class Recording:
    """What record() returns: close() writes the trace."""

    def __init__(self, accelerator, model, optimizer, loader, scheduler, out, loss_fn, count_fn,
                 items, head, lr, schedule, warmup, epochs, max_steps, clip, accept, quiet,
                 calibrate_every):
        if (loss_fn is None) != (count_fn is None):
            raise Refused("pass both loss_fn=(model, batch) -> summed item loss and "
                          "count_fn=(batch) -> items, or neither (standard heads)")
        if scheduler is not None and schedule is None:
            raise Refused("a scheduler is passed: declare the schedule it is meant to follow: "
                          "record(..., schedule=scheduler) (the one you pass, not yet stepped; "
                          "lr= the base lr you meant the optimizer to have), another scheduler, "
                          "lr_lambda or factory, or schedule='linear' | 'cosine' | 'constant' "
                          "with warmup=optimizer steps and epochs=your epochs")
        schedule = "constant" if schedule is None else schedule
        named = isinstance(schedule, str)
        if (not named or schedule == "constant") and epochs is None and max_steps is None:
            epochs = 1  # the horizon is read by linear and cosine only
        try:
            dataset = len(loader.dataset)
        except TypeError:
            raise Refused("the prepared loader's dataset has no len(): record() takes "
                          "map-style datasets") from None
        bs = getattr(loader, "batch_size", None) or getattr(loader.batch_sampler, "batch_size", None)
        self.sem = _common.Semantics(
            accumulation=accelerator.gradient_accumulation_steps, micro_batch=bs or 1,
            dataset=dataset, epochs=epochs, max_steps=max_steps,
            world=accelerator.num_processes, lr=lr, schedule=schedule, warmup=warmup, clip=clip)
        self.accept, self.head = _common.accepted(accept), head
        self.accelerator, self.model, self.loader = accelerator, model, loader
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer
        self.out, self.items, self.quiet, self.calibrate_every = out, items, quiet, calibrate_every
        self.loss_fn, self.count_fn = loss_fn, count_fn
        self.recorder = None
        self._watch(loader)

    def _watch(self, loader):
        """The prepared loader's own iteration (its end-of-dataloader sync
        included), each batch drawn reported to the recorder."""
        rec, base = self, type(loader)

        def __iter__(self_):
            first = True
            for batch in base.__iter__(self_):
                if rec.recorder is None:
                    rec._start(batch)
                if first:
                    rec.recorder._new_epoch(_Shard(self_) if rec.accelerator.num_processes > 1
                                            else self_)
                    first = False
                rec.recorder._drawn(batch)
                yield batch
        # Accelerate's loaders answer __class__ with their base loader's
        # class (a property): the instance's own class is set through
        # object's descriptor.
        _set_class(loader, type("Watched" + base.__name__, (base,), {"__iter__": __iter__}))
        self._base = base

    def _start(self, batch):
        if self.loss_fn is not None:
            loss_fn, count_fn, items = self.loss_fn, self.count_fn, self.items or "samples"
        else:
            loss_fn, count_fn, items = _common.standard_head_of(self.model, batch, self.head)
        self.recorder = _common.recorder(
            self.model, self.optimizer, loss_fn, count_fn, self.accelerator.num_processes,
            out=self.out, items=items, quiet=self.quiet, accept=self.accept,
            calibrate_every=self.calibrate_every, **self.sem.recorder_kwargs())

    def close(self):
        """Writes the trace (every rank must call it under DDP), and gives
        the loader its own class back."""
        _set_class(self.loader, self._base)
        if self.recorder is None:
            raise Refused("the loop drew no batch from the prepared loader: nothing to certify")
        if not self.recorder.steps and not self.recorder.closed and stopped_by() is None:
            # Refused by the recorder: it ends without a trace, its marker
            # saying why.
            self.recorder._refuse("the loop never stepped the optimizer (%d micro-batches, "
                                  "gradient_accumulation_steps=%d): nothing to certify"
                                  % (len(self.recorder.micro), self.sem.K))
        self.recorder.close()  # while an exception propagates (`with` left by it): no trace

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def record(accelerator, model, optimizer, loader, scheduler=None, out="trace", loss_fn=None,
           count_fn=None, items=None, head=None, lr=None, schedule=None, warmup=0, epochs=None,
           max_steps=None, clip=None, accept=(), quiet=True, calibrate_every=None):
    """Records the loop over the prepared (model, optimizer, loader,
    scheduler); returns a Recording whose close() writes the trace."""
    return Recording(accelerator, model, optimizer, loader, scheduler, out, loss_fn, count_fn,
                     items, head, lr, schedule, warmup, epochs, max_steps, clip, accept, quiet,
                     calibrate_every)
