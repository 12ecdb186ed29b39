"""Transformers' Trainer, recorded for the contract tier (docs/frameworks.md).

    from accumcheck_torch.integrations.transformers import AccumcheckCallback
    trainer = Trainer(model, args, train_dataset=..., data_collator=...,
                      callbacks=[AccumcheckCallback(out="trace/")])
    trainer.train()
    accumcheck certify --contract --trace trace/

A release whose callbacks receive no model, optimizer or train DataLoader
is refused at on_train_begin unless the callback is attached with
attach(trainer, ...) (below), which takes them from the Trainer itself.

At on_train_begin the callback builds a ContractRecorder (one rank) or a
ContractDistributedRecorder (torch.distributed initialised) on the
Trainer's model and the torch optimizer under its wrapper, and makes the
Trainer's train DataLoader draw through the recorder (its class swapped
for a subclass whose __iter__ is the recorder's watch(): the Trainer keeps
the same object, so every isinstance, len and set_epoch still holds).  At
on_train_end it writes the trace (and certifies it with certify=True).

What the run is judged against comes from TrainingArguments as the user
set them, computed by _common.Semantics (never from the Trainer's own
derived counts, where its bugs live): gradient_accumulation_steps,
per_device_train_batch_size, len(train_dataset), num_train_epochs or
max_steps, the world size, dataloader_drop_last, learning_rate,
lr_scheduler_type with warmup_steps / warmup_ratio, max_grad_norm.
"""

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from ..contract import ContractRecorder, _Watched
from ..distributed import ContractDistributedRecorder
from ..trace import Refused
from ._common import Semantics, certify, standard_head, unshifted_count_fn

# lr_scheduler_type values (their .value) and the accepted kind.
_SCHEDULES = {"constant": "constant", "linear": "linear", "cosine": "cosine"}


def _value(x):
    return getattr(x, "value", x)


def semantics_of(args, dataset_len, world=None):
    """Semantics from TrainingArguments as configured (see the module's
    docstring)."""
    kind = _value(args.lr_scheduler_type)
    if kind not in _SCHEDULES:
        raise Refused("lr_scheduler_type=%r: the contract tier judges %s" % (
            kind, ", ".join(sorted(_SCHEDULES))))
    warmup = getattr(args, "warmup_steps", 0) or 0
    ratio = getattr(args, "warmup_ratio", 0) or 0
    if 0 < warmup < 1:  # Transformers 5: a float warmup_steps below 1 is a ratio
        warmup, ratio = 0, warmup
    if world is None:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return Semantics(accumulation=args.gradient_accumulation_steps,
                     micro_batch=args.per_device_train_batch_size, dataset=dataset_len,
                     epochs=args.num_train_epochs, max_steps=args.max_steps, world=world,
                     drop_last=args.dataloader_drop_last, lr=args.learning_rate,
                     schedule=_SCHEDULES[kind], warmup=int(warmup), warmup_ratio=ratio,
                     clip=args.max_grad_norm)


def _torch_optimizer(opt):
    """The torch.optim.Optimizer under Accelerate's AcceleratedOptimizer
    (and any other wrapper that keeps it as .optimizer)."""
    seen = 0
    # AcceleratedOptimizer is an Optimizer subclass that never ran
    # Optimizer.__init__ (no hooks of its own): descend to what it wraps.
    while getattr(opt, "optimizer", None) is not None and seen < 8:
        opt, seen = opt.optimizer, seen + 1
    if not isinstance(opt, torch.optim.Optimizer):
        raise Refused("the Trainer's optimizer %s is not a torch.optim.Optimizer (nor wraps one as "
                      ".optimizer): the contract tier replays PyTorch's optimizer classes only"
                      % type(opt).__name__)
    return opt


def watch_in_place(loader, rec, rows=None):
    """Make `loader` (the object the Trainer iterates) draw through
    rec.watch(): its class becomes a subclass whose __iter__ is the
    recorder's; everything else is the loader's own.  rows(k): the
    dataset rows the sampler draws for the epoch's micro-batch k (from 0),
    the samples recorded for a batch of one row where the sampler drew
    more: a padding-free collator concatenated them (TRL's packing and
    padding_free: 1.x with position_ids starting again at each sequence,
    0.19 without; Transformers' DataCollatorWithFlattening), so its shape
    counts no rows."""
    base = type(loader)

    class _Plain:
        dataset = getattr(loader, "dataset", None)
        batch_size = getattr(loader, "batch_size", None)
        sampler = getattr(loader, "sampler", None)

        def __iter__(self):
            return base.__iter__(loader)

    def __iter__(self):
        if rows is None:
            return iter(_Watched(rec, _Plain()))
        return _rows_of_flattened(_Watched(rec, _Plain()))

    def _rows_of_flattened(watched):
        it, k = iter(watched), 0
        while True:
            drawn = len(rec.micro)
            try:
                batch = next(it)
            except StopIteration:
                return
            if len(rec.micro) == drawn + 1 and rec.micro[-1][3] == 1 < rows(k):
                rec.micro[-1][3] = rows(k)  # the samples, as the sampler drew them
            k += 1
            yield batch

    # object's own __class__ setter: Accelerate's DataLoaderAdapter
    # overrides __class__ with a read-only property (its base loader's).
    object.__dict__["__class__"].__set__(loader, type(base.__name__, (base,), {"__iter__": __iter__}))
    return loader


class AccumcheckCallback(TrainerCallback):
    """AccumcheckCallback(out="trace", head=None, loss_fn=None,
    count_fn=None, items=None, certify=False, command=None, **recorder)

    head: 'causal_lm' | 'sequence_classification' (default: from the
    model's class name); loss_fn(model, batch) -> summed item loss and
    count_fn(batch) -> item count with items='tokens' | 'samples' for any
    other model.  certify=True runs `accumcheck certify --contract` at the
    end (self.returncode, self.report).  Other keywords go to the
    recorder (calibrate_every, quiet)."""

    def __init__(self, out="trace", head=None, loss_fn=None, count_fn=None, items=None,
                 certify=False, command=None, **recorder):
        if (loss_fn is None) != (count_fn is None):
            raise Refused("pass loss_fn and count_fn together (the summed item loss and the item "
                          "count of a batch)")
        if loss_fn is not None and items not in ("tokens", "samples"):
            raise Refused("with loss_fn and count_fn, pass items='tokens' or 'samples'")
        self.out, self.head, self.fns = out, head, (loss_fn, count_fn, items)
        self.do_certify, self.command, self.extra = certify, command, recorder
        self.rec, self.semantics, self.returncode, self.report = None, None, None, None

    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       train_dataloader=None, **kwargs):
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            # attach(): what the callback did not receive, from the Trainer
            # itself (its model and optimizer as it holds them now, the
            # loader its get_train_dataloader returned for this train()).
            model = model if model is not None else trainer.model
            optimizer = optimizer if optimizer is not None else trainer.optimizer
            if train_dataloader is None:
                train_dataloader = self._loader
        if model is None or optimizer is None or train_dataloader is None:
            missing = [n for n, v in (("model", model), ("optimizer", optimizer),
                                      ("train_dataloader", train_dataloader)) if v is None]
            said = missing[0] if len(missing) == 1 else "%s or %s" % (", ".join(missing[:-1]),
                                                                       missing[-1])
            raise Refused("the Trainer passed no %s to on_train_begin (this Transformers "
                          "release's callbacks do not receive %s): attach the callback to the "
                          "Trainer instead of callbacks=[...]: "
                          "accumcheck_torch.integrations.transformers.attach(trainer, out=...) "
                          "before trainer.train() (docs/frameworks.md)"
                          % (said, "it" if len(missing) == 1 else "them"))
        dataset = getattr(train_dataloader, "dataset", None)
        try:
            n = len(dataset)
        except TypeError:
            raise Refused("the train dataset has no len(): the contract tier needs a sized "
                          "dataset (an IterableDataset is not supported)") from None
        self.semantics = semantics_of(args, n)
        loss_fn, count_fn, items = self.fns
        if loss_fn is None:
            loss_fn, count_fn, items = standard_head(model, self.head)
        opt = _torch_optimizer(optimizer)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        cls = ContractDistributedRecorder if distributed else ContractRecorder
        extra = dict(self.extra)
        extra.setdefault("unshifted_count_fn", unshifted_count_fn(count_fn))
        self.rec = cls(model, opt, loss_fn, count_fn, out=self.out, items=items,
                       run="transformers", **self.semantics.recorder_kwargs(), **extra)
        sem = self.semantics
        watch_in_place(train_dataloader, self.rec,
                       rows=lambda k: max(1, min(sem.micro_batch,
                                                 sem.rank_samples - k * sem.micro_batch)))

    def on_train_end(self, args, state, control, **kwargs):
        if self.rec is None:
            return
        # Each epoch as configured: this rank's share of the training set
        # (ceil(N / world)) in micro-batches of per_device_train_batch_size,
        # not what the Trainer's loader says of itself (Accelerate's
        # loaders have no batch_size; a loop that stops early draws less).
        for e in self.rec.epochs:
            e[0], e[1] = self.semantics.rank_samples, self.semantics.micro_batch
        if self.rec.steps == 0:
            # Refused by the recorder: it ends without a trace (its marker
            # says why), so no folder holds a run of no step to judge.
            self.rec._refuse("the Trainer never stepped the optimizer (%d micro-batches drawn, "
                             "gradient_accumulation_steps=%d): there is nothing to certify; train "
                             "for at least one window" % (len(self.rec.micro), self.semantics.K))
        self.rec.close()
        if self.do_certify and (not dist.is_initialized() or dist.get_rank() == 0):
            self.returncode, self.report = certify(self.out, self.command)


def attach(trainer, callback=None, **kwargs):
    """The callback attached to a Trainer whose callbacks do not receive the
    model, optimizer and train DataLoader (a release that passes them no
    more, or not yet): adds `callback` (default AccumcheckCallback(**kwargs))
    with trainer.add_callback, and hooks the Trainer's get_train_dataloader
    (an instance attribute wrapping its own method) so the loader each
    train() builds is known; at on_train_begin the callback takes what it
    did not receive from the Trainer (trainer.model, trainer.optimizer as
    the Trainer holds them then, that loader).  Returns the callback.

        trainer = Trainer(model, args, train_dataset=ds, data_collator=collate)
        callback = attach(trainer, out="trace/")
        trainer.train()"""
    if callback is None:
        callback = AccumcheckCallback(**kwargs)
    elif kwargs:
        raise Refused("attach(trainer, callback, ...): pass the callback's options to "
                      "AccumcheckCallback(...) or to attach without a callback, not both")
    if not callable(getattr(trainer, "get_train_dataloader", None)) or \
            not callable(getattr(trainer, "add_callback", None)):
        raise Refused("attach: expected a transformers Trainer (with get_train_dataloader and "
                      "add_callback), got %s" % type(trainer).__name__)
    own = trainer.get_train_dataloader
    callback._trainer, callback._loader = trainer, None

    def get_train_dataloader(*args, **kw):
        callback._loader = own(*args, **kw)
        return callback._loader

    trainer.get_train_dataloader = get_train_dataloader
    trainer.add_callback(callback)
    return callback
