"""The Trainer set-up the Transformers cases share: TrainingArguments on
the CPU with no hub, no reporting, no saving, no logging; the tiny data;
AccumcheckCallback recording (unless --no-record); --identity (train)."""

import copy
import os
import sys
import tempfile
import time

import torch

import _tiny
from _tiny import VariableTokens, collate


def train(args, model, **kw):
    """trained(args, model, **kw); under --identity (_tiny.digested) first
    on a copy of the model made before either run, without the recorder,
    in this process (the Trainer seeds itself: TrainingArguments(seed=0)).
    Returns the CPU seconds of the recorded run's trainer.train()."""
    if getattr(args, "identity", None) and not args.no_record:
        plain = copy.copy(args)
        plain.no_record = True
        trained(plain, copy.deepcopy(model), **kw)
    return trained(args, model, **kw)


def trained(args, model, K=4, batch=2, n=24, epochs=2, optim="sgd", lr=0.1, schedule="constant",
            warmup=0, warmup_ratio=0.0, clip=0.0, gradient_checkpointing=False, gradient_checkpointing_kwargs=None,
            blind=False, attach=False, bf16=False, fp16=False, **recorder):
    """Trainer(model, TrainingArguments(gradient_accumulation_steps=K, ...))
    on n variable-length sequences, micro-batches of `batch`.  optim 'sgd':
    torch.optim.SGD(lr) without momentum passed as optimizers=(sgd, None);
    'adamw': the Trainer's own (optim='adamw_torch'); gradient_checkpointing
    and its kwargs: TrainingArguments'.  blind: the Trainer's callback
    handler passes its callbacks no model, optimizer or train DataLoader (a
    release that does not: blind_handler); attach: the callback attached with
    integrations.transformers.attach(trainer) instead of callbacks=[...];
    bf16: TrainingArguments(bf16=True), the forward under bfloat16 autocast;
    fp16: TrainingArguments(fp16=True), under float16 autocast (on the CPU
    no loss scaler: Accelerate makes a GradScaler on an accelerator only).
    warmup_ratio: the warmup as a fraction of the Trainer's step budget
    (TrainingArguments' warmup_ratio; Transformers 5 has none and reads a
    warmup_steps below 1 as that ratio).
    Returns the CPU seconds of trainer.train()."""
    from transformers import Trainer, TrainingArguments

    from accumcheck_torch.integrations import transformers as integration
    AccumcheckCallback = integration.AccumcheckCallback

    import dataclasses

    ratio = {"warmup_steps": warmup}
    if warmup_ratio:
        fields = {f.name for f in dataclasses.fields(TrainingArguments)}
        ratio = ({"warmup_ratio": warmup_ratio} if "warmup_ratio" in fields
                 else {"warmup_steps": warmup_ratio})
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, gradient_accumulation_steps=K, per_device_train_batch_size=batch,
            num_train_epochs=epochs, learning_rate=lr, lr_scheduler_type=schedule,
            max_grad_norm=clip, weight_decay=0.0, optim="adamw_torch",
            report_to="none", save_strategy="no", logging_strategy="no", use_cpu=True,
            disable_tqdm=True, seed=0, dataloader_num_workers=0,
            gradient_checkpointing=gradient_checkpointing, bf16=bf16, fp16=fp16,
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
            ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
            **ratio)
        opts = (None, None)
        if optim == "sgd":
            opts = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0), None)
        callbacks = [] if args.no_record or attach else [AccumcheckCallback(out=args.out,
                                                                            **recorder)]
        trainer = Trainer(model=model, args=targs, train_dataset=VariableTokens(n),
                          data_collator=collate, optimizers=opts, callbacks=callbacks)
        if blind:
            blind_handler(trainer.callback_handler)
        if attach and not args.no_record:
            integration.attach(trainer, out=args.out, **recorder)
        t0 = time.process_time()
        trainer.train()
        cpu = time.process_time() - t0
    print("trainer.train: %.3f s CPU" % cpu, file=sys.stderr)
    _tiny.digested(args, model)
    return cpu


def blind_handler(handler):
    """Makes the Trainer's CallbackHandler pass every callback model=None,
    optimizer=None and train_dataloader=None (what it hands them are its
    attributes: here properties that keep nothing), as a release whose
    callbacks do not receive them would."""
    none = property(lambda self: None, lambda self, value: None)
    cls = type("Blind" + type(handler).__name__, (type(handler),),
               {"model": none, "optimizer": none, "train_dataloader": none})
    handler.__class__ = cls
