"""Trainer shapes beside train.py's loops, on the GPT-style decoder
(models.py), recorded for the contract tier: an EMA of the model (a timm
ModelEmaV2-shaped class, torch's AveragedModel, one written by hand), an
optimizer built inside the trainer with the batches marked one by one by a
framework's callbacks, and a gradient bucket in bfloat16 or float32.

    shapes.py --shape ema --out trace/
    accumcheck certify --contract --trace trace/

Shapes (--shape): ema (ModelEmaV2 updated after each optimizer step),
ema_micro (updated after every backward: ema-every-micro-step), ema_early
(updated before optimizer.step()), averaged (AveragedModel with
get_ema_multi_avg_fn), hand (a hand-written EMA), hand_swapped (its weights
swapped: ema = (1-d)*ema + d*p), late (the optimizer built inside the
trainer, attached and each micro-batch marked by callbacks), late_no_div_k
(the same with the token mean per micro-batch and no / K), bf16_bucket and
fp32_bucket (.grad rounded to the bucket's dtype after each backward),
l2_hook (L2 added to .grad after each backward: a change the recorder does
not see, which certify refuses to judge).  --no-record: the same run
without the recorder; --identity PATH: without it, then with it, in this
process (the model and its EMA must be the same bits: identity.py)."""

import argparse
import copy

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader

import identity
import models
from accumcheck_torch import ContractRecorder, exit_on_refusal
from models import windows

DECAY = 0.9


class ModelEmaV2:
    """timm.utils.ModelEmaV2's API: a copy of the model, updated by
    ema.update(model) as ema = decay*ema + (1-decay)*model over its
    state_dict."""

    def __init__(self, model, decay=0.9999, device=None):
        self.module = copy.deepcopy(model).eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            e.copy_(self.decay * e + (1.0 - self.decay) * m)


class HandEma:
    """An EMA written by hand over the parameters."""

    def __init__(self, model, decay, swapped=False):
        self.shadow = [p.detach().clone() for p in model.parameters()]
        self.decay, self.swapped = decay, swapped

    @torch.no_grad()
    def update(self, model):
        d = 1 - self.decay if self.swapped else self.decay
        for s, p in zip(self.shadow, model.parameters()):
            s.mul_(d).add_(p.detach(), alpha=1 - d)


def grad_bucket(params, dtype):
    """.grad kept in `dtype` after every backward (a gradient bucket: the
    running sum rounded at each accumulation, s = rnd(s + g))."""
    def hook(p):
        p.grad.copy_(p.grad.to(dtype))
    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def l2_into_grad(params, wd=0.01):
    """L2 regularisation added to .grad after every backward (a hook
    outside the recorder's view: not a backward of the summed loss)."""
    def hook(p):
        p.grad.add_(p.detach(), alpha=wd)
    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def transformers_loop(model, opt, batches, K, epochs, after_backward=None, after_step=None,
                      before_step=None, clip=None):
    """train.py's Transformers-style loop, with the EMA's call sites and
    clip_grad_norm_(clip) before each step."""
    for _ in range(epochs):
        for window in windows(batches(), K):
            n = sum(models.gpt_items(b) for b in window)
            for b in window:
                (models.gpt_summed_loss(model, b) / n).backward()
                if after_backward:
                    after_backward()
            if before_step:
                before_step()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            if after_step:
                after_step()


class Callbacks:
    """What a framework integration does with the recorder: attach the
    optimizer at train begin, start each epoch, mark each micro-batch."""

    def __init__(self, rec):
        self.rec = rec

    def on_train_begin(self, optimizer):
        self.rec.attach(optimizer)

    def on_epoch_begin(self, loader):
        self.rec.epoch(loader)

    def on_micro_batch(self, batch):
        self.rec.mark(batch)


def framework_fit(model, data, K, epochs, callbacks, no_div_k=False):
    """A trainer that builds its optimizer itself and draws its own loader:
    the recorder sees them only through the callbacks."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    callbacks.on_train_begin(optimizer)
    shuffler = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        loader = DataLoader(data, batch_size=4, shuffle=True, generator=shuffler)
        callbacks.on_epoch_begin(loader)
        for window in windows(loader, K):
            n = sum(models.gpt_items(b) for b in window)
            for b in window:
                callbacks.on_micro_batch(b)
                if no_div_k:
                    loss = models.gpt_mean_loss(model, b)
                else:
                    loss = models.gpt_summed_loss(model, b) / n
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()


SHAPES = ("ema", "ema_micro", "ema_early", "averaged", "hand", "hand_swapped", "late",
          "late_no_div_k", "bf16_bucket", "fp32_bucket", "l2_hook")


class _Unrecorded:
    """The callbacks of a run without the recorder (--no-record)."""

    def on_train_begin(self, optimizer):
        pass

    def on_epoch_begin(self, loader):
        pass

    def on_micro_batch(self, batch):
        pass


def parse():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="ema")
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--out", default="trace")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--clip", type=float, default=None,
                    help="clip_grad_norm_(max_norm) before each optimizer.step(), declared")
    ap.add_argument("--no-record", action="store_true", help="the same run without the recorder")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; write "
                    "both runs' digests (the model and its EMA) to PATH.rank0 (identity.py)")
    return ap.parse_args()


def run(a):
    """One run of the shape; returns what it trained (the model, and its
    EMA where it keeps one)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, data = models.TinyGPT(), models.gpt_data()
    model.train()
    kw = dict(accumulation=a.K, out=a.out, items="tokens")
    if a.shape.startswith("late"):
        if a.no_record:
            framework_fit(model, data, a.K, a.epochs, _Unrecorded(),
                          no_div_k=a.shape == "late_no_div_k")
            return model
        with ContractRecorder(model, None, models.gpt_summed_loss, models.gpt_items, **kw) as rec:
            framework_fit(model, data, a.K, a.epochs, Callbacks(rec),
                          no_div_k=a.shape == "late_no_div_k")
        return model
    if a.shape.endswith("bucket"):
        grad_bucket(model.parameters(),
                    torch.bfloat16 if a.shape == "bf16_bucket" else torch.float32)
    if a.shape == "l2_hook":
        l2_into_grad(model.parameters())
    # The EMA made before the recorder (its copy of the model then holds
    # none of the recorder's hooks).
    ema = None
    if a.shape.startswith("ema"):
        ema = ModelEmaV2(model, decay=DECAY)
    elif a.shape == "averaged":
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY))
        ema.update = ema.update_parameters
    elif a.shape.startswith("hand"):
        ema = HandEma(model, DECAY, swapped=a.shape == "hand_swapped")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    rec = None if a.no_record else ContractRecorder(model, opt, models.gpt_summed_loss,
                                                    models.gpt_items, clip=a.clip, **kw)
    if rec is None:
        pass
    elif isinstance(ema, HandEma):
        rec.ema(ema.shadow, decay=DECAY)
    elif ema is not None:
        rec.ema(ema)
    update = (lambda: ema.update(model)) if ema is not None else None  # noqa: E731
    shuffler = torch.Generator().manual_seed(1)
    watch = rec.watch if rec is not None else (lambda loader: loader)  # noqa: E731
    batches = lambda: watch(DataLoader(data, batch_size=4, shuffle=True,  # noqa: E731
                                       generator=shuffler))
    transformers_loop(model, opt, batches, a.K, a.epochs,
                      after_backward=update if a.shape == "ema_micro" else None,
                      before_step=update if a.shape == "ema_early" else None,
                      after_step=update if a.shape in ("ema", "averaged", "hand", "hand_swapped")
                      else None, clip=a.clip)
    if rec is not None:
        rec.close()
    kept = {ModelEmaV2: lambda e: e.module, AveragedModel: lambda e: e,
            HandEma: lambda e: e.shadow}
    return model if ema is None else [model, kept[type(ema)](ema)]


def main():
    a = parse()
    if a.identity:
        identity.twice(lambda rank, ranks, b: run(b), a.identity, 0, 1, a)
    else:
        run(a)


if __name__ == "__main__":
    exit_on_refusal(main)
