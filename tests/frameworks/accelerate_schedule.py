"""Accelerate, the classifier of accelerate_classifier.py (an MLP, the
batch's mean cross-entropy), Accelerator(gradient_accumulation_steps=4),
micro-batches of 4, 48 samples (3 full windows per epoch), 2 epochs, SGD,
a prepared StepLR(step_size=2, gamma=0.5) declared as the loop has it:
record(..., scheduler, schedule=scheduler).

Variants:
  steplr           the everyday loop, optimizer.step(); scheduler.step(): PASS
  before_optimizer scheduler.step() before optimizer.step() inside accumulate():
                   each step uses the lr of the next (scheduler-before-optimizer)
  lr_times_k       SGD(lr=0.1 * K) built before the StepLR (the linear scaling
                   rule), record(..., lr=0.1) stating the base lr meant: FAIL lr,
                   "lr at every step is K x the schedule (... the linear
                   scaling rule)"
  lr_times_k_unstated  the same without lr=: the StepLR's table starts at
                   0.1 * K, the mistake is the declared schedule's own: PASS
                   (what lr= is for)"""

import sys

import torch
import torch.nn.functional as F

import _tiny

VARIANTS = ["steplr", "before_optimizer", "lr_times_k", "lr_times_k_unstated"]
K, EPOCHS, BATCH, LR = 4, 2, 4, 0.1


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from accelerate import Accelerator
    from accumcheck_torch.integrations.accelerate import record

    torch.manual_seed(0)
    torch.set_num_threads(1)
    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = _tiny.MLP()
    loader = torch.utils.data.DataLoader(_tiny.classifier_data(n=48), batch_size=BATCH,
                                         shuffle=True, generator=torch.Generator().manual_seed(1))
    lr = LR * K if a.variant.startswith("lr_times_k") else LR
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    rec = None
    if not a.no_record:
        rec = record(accelerator, model, optimizer, loader, scheduler, out=a.out,
                     schedule=scheduler, lr=LR if a.variant == "lr_times_k" else None)
    model.train()
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(F.cross_entropy(model(x), y))
                if a.variant == "before_optimizer":
                    scheduler.step()
                optimizer.step()
                if a.variant != "before_optimizer":
                    scheduler.step()
                optimizer.zero_grad()
    if rec is not None:
        rec.close()
    _tiny.digested(a, accelerator.unwrap_model(model), accelerator.process_index,
                   accelerator.num_processes)
    return 0


if __name__ == "__main__":
    sys.exit(_tiny.spawn(main, sys.argv[1:], 1))
