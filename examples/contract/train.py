"""Training loops as users write them, on the GPT-style decoder or the CNN
(models.py), each optionally recorded for the contract tier.

    train.py --model gpt --loop transformers --K 4 --out trace/
    accumcheck certify --contract --trace trace/

Each loop below is a complete loop in one idiom; the mistakes are the ones
reported in the field.  --no-record runs the same loop without the
recorder (for timing: bench/contract_bench.py).  --schedule and --clip add
an lr scheduler and clip_grad_norm_ around the step (declared to the recorder
unless --undeclared-clip)."""

import argparse
import contextlib
import copy
import hashlib
import itertools
import os
import time

import torch
from torch.utils.data import DataLoader


import models
from accumcheck_torch import ContractRecorder, exit_on_refusal
from accumcheck_torch.schedule import Cadence
from models import warmup_linear, windows


# ---- correct loops

def transformers(m, opt, load, K, epochs, mean, items, summed):
    for _ in range(epochs):
        for window in windows(load(), K):
            num_items_in_batch = sum(items(b) for b in window)
            for b in window:
                loss = summed(m, b) / num_items_in_batch
                loss.backward()
            opt.step()
            opt.zero_grad()


class LitModule:
    """Lightning's manual optimization (automatic_optimization = False):
    training_step does its own backward and steps every K batches or at the
    epoch's end; the window's item count comes from on_train_epoch_start's
    look at the epoch's batches."""

    def __init__(self, model, opt, K, items, summed):
        self.model, self.opt, self.K, self.items, self.summed = model, opt, K, items, summed

    def on_train_epoch_start(self, batches):
        self.counts = [self.items(b) for b in batches]

    def training_step(self, batch, i, last):
        w0 = i - i % self.K
        n = sum(self.counts[w0:w0 + self.K])
        loss = self.summed(self.model, batch) / n
        loss.backward()  # self.manual_backward(loss)
        if (i + 1) % self.K == 0 or last:
            self.opt.step()
            self.opt.zero_grad()


def lightning(m, opt, load, K, epochs, mean, items, summed):
    lit = LitModule(m, opt, K, items, summed)
    for _ in range(epochs):
        batches = list(load())
        lit.on_train_epoch_start(batches)
        for i, b in enumerate(batches):
            lit.training_step(b, i, i + 1 == len(batches))


# ---- the mistakes

def mean_over_k(m, opt, load, K, epochs, mean, items, summed):
    """Transformers before 4.46: each micro-batch's token mean / K."""
    for _ in range(epochs):
        for window in windows(load(), K):
            for b in window:
                (mean(m, b) / K).backward()
            opt.step()
            opt.zero_grad()


def no_div_k(m, opt, load, K, epochs, mean, items, summed):
    for _ in range(epochs):
        for window in windows(load(), K):
            for b in window:
                mean(m, b).backward()
            opt.step()
            opt.zero_grad()


def summed_over_k(m, opt, load, K, epochs, mean, items, summed):
    """reduction="sum" with the / K meant for a mean: each micro-batch's
    summed loss divided by K, so every item weighs 1/K, not 1/N_w
    (summed-loss-divided-by-k)."""
    for _ in range(epochs):
        for window in windows(load(), K):
            for b in window:
                (summed(m, b) / K).backward()
            opt.step()
            opt.zero_grad()


def zero_grad_inside(m, opt, load, K, epochs, mean, items, summed):
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(items(b) for b in window)
            for b in window:
                opt.zero_grad()
                (summed(m, b) / n).backward()
            opt.step()


def step_outside_if(m, opt, load, K, epochs, mean, items, summed):
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(items(b) for b in window)
            for k, b in enumerate(window):
                (summed(m, b) / n).backward()
                opt.step()
                if k + 1 == len(window):
                    opt.zero_grad()


def rescaled_accumulator(m, opt, load, K, epochs, mean, items, summed):
    """Megatron-LM #6660: the accumulator doubled before every micro-batch
    is added (buf = 2*buf + g)."""
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(items(b) for b in window)
            for b in window:
                for p in m.parameters():
                    if p.grad is not None:
                        p.grad.mul_(2)
                (summed(m, b) / n).backward()
            opt.step()
            opt.zero_grad()


def off_by_one(m, opt, load, K, epochs, mean, items, summed):
    """`if i % K == 0` on a 0-based counter (seeds 002 and 004)."""
    for _ in range(epochs):
        for i, b in enumerate(load()):
            (mean(m, b) / K).backward()
            if i % K == 0:
                opt.step()
                opt.zero_grad()


def leak(m, opt, load, K, epochs, mean, items, summed):
    """`if (i + 1) % K == 0` and nothing at the epoch's end: the leftovers
    join the next epoch's first window."""
    for _ in range(epochs):
        for i, b in enumerate(load()):
            (mean(m, b) / K).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()


def skip_short(m, opt, load, K, epochs, mean, items, summed):
    """DataLoader(drop_last=True): the short last micro-batch never drawn."""
    for _ in range(epochs):
        for window in windows(load(drop_last=True), K):
            n = sum(items(b) for b in window)
            for b in window:
                (summed(m, b) / n).backward()
            opt.step()
            opt.zero_grad()


def double_count(m, opt, load, K, epochs, mean, items, summed):
    """The first micro-batch of every window backwarded twice (a retry)."""
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(items(b) for b in window)
            for k, b in enumerate(window):
                loss = summed(m, b) / n
                loss.backward(retain_graph=k == 0)
                if k == 0:
                    loss.backward()
            opt.step()
            opt.zero_grad()


def clip_per_micro_step(m, opt, load, K, epochs, mean, items, summed):
    """clip_grad_norm_ after every backward instead of once before the
    step: each partial sum clipped by its own norm."""
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(items(b) for b in window)
            for b in window:
                (summed(m, b) / n).backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), opt.max_norm)
            opt.step()
            opt.zero_grad()


def double_count_last(m, opt, load, K, epochs, mean, items, summed):
    """The first micro-batch of each epoch's last window backwarded twice
    (a retry at the epoch's end): the windows before it are correct."""
    for _ in range(epochs):
        ws = list(windows(load(), K))
        for w, window in enumerate(ws):
            n = sum(items(b) for b in window)
            for k, b in enumerate(window):
                loss = summed(m, b) / n
                twice = w + 1 == len(ws) and k == 0
                loss.backward(retain_graph=twice)
                if twice:
                    loss.backward()
            opt.step()
            opt.zero_grad()


def step_first_alone(m, opt, load, K, epochs, mean, items, summed):
    """An extra optimizer.step() after each window's first backward (a
    logging hook that steps): that micro-batch is stepped alone, the rest of
    the window at the window's end."""
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(items(b) for b in window)
            for k, b in enumerate(window):
                (summed(m, b) / n).backward()
                if k == 0:
                    opt.step()
                    opt.zero_grad()
            opt.step()
            opt.zero_grad()


def unshifted_count(m, opt, load, K, epochs, mean, items, summed):
    """Transformers 4.47-4.53's num_items_in_batch: the window's labels
    counted over the UNSHIFTED labels, (labels != -100).sum(), while the
    loss shifts them: each sequence whose first label is not masked counts
    once too often (token-count-unshifted-labels)."""
    for _ in range(epochs):
        for window in windows(load(), K):
            n = sum(int((b[1] != models.IGNORE).sum()) for b in window)
            for b in window:
                (summed(m, b) / n).backward()
            opt.step()
            opt.zero_grad()


def across_epochs_k_twice(m, opt, load, K, epochs, mean, items, summed, drop_last=False):
    """Three mistakes at once (issue 44), as framework releases combine
    them: each micro-batch's token mean divided by K by the user and again
    by a framework's backward, stepped on a micro-batch counter that runs
    across epochs (an epoch's leftovers join the next epoch's first window;
    the run's are never stepped)."""
    total = 0
    for _ in range(epochs):
        for b in load(drop_last=drop_last):
            (mean(m, b) / K / K).backward()
            total += 1
            if total % K == 0:
                opt.step()
                opt.zero_grad()


def across_epochs_k_twice_drop_last(m, opt, load, K, epochs, mean, items, summed):
    """The three above and a fourth: DataLoader(drop_last=True), the short
    last micro-batch never drawn."""
    across_epochs_k_twice(m, opt, load, K, epochs, mean, items, summed, drop_last=True)


def _trainer_budget(M, K, epochs):
    """Transformers 4.45-4.51's step budget, counted before training:
    max_steps = epochs x max(len(dataloader) // K, 1)."""
    return epochs * max(M // K, 1)


def trainer_4_46(m, opt, load, K, epochs, mean, items, summed):
    """Transformers 4.46.1's Trainer._inner_training_loop on an epoch of M
    batches (issue 44), what it does and nothing else: max_steps =
    epochs x max(M // K, 1) counted before training (the scheduler is built
    with it too: --schedule cosine-budget); each epoch drawn in fetches of
    K batches (get_batch_samples), the last of len(dataset) % K (K when 0)
    batches; num_items_in_batch counted over each fetch's shifted labels;
    the step where a batch counter that runs across epochs reaches a
    multiple of K (total_batched_samples), or at the last batch of an
    epoch of at most K; training stops once global_step reaches max_steps
    (DefaultFlowCallback)."""
    M = len(load())
    n_examples = len(_dataset(load()))
    max_steps, global_step, total = _trainer_budget(M, K, epochs), 0, 0
    for _ in range(epochs):
        it, step = iter(load()), -1
        remainder = n_examples % K or K
        total_updates = M // K + 1
        for update in range(total_updates):
            fetch = list(itertools.islice(it, K if update != total_updates - 1 else remainder))
            num_items_in_batch = sum(items(b) for b in fetch)
            for b in fetch:
                step += 1
                total += 1
                (summed(m, b) / num_items_in_batch).backward()
                if (M <= K and step + 1 == M) or total % K == 0:
                    opt.step()
                    opt.zero_grad()
                    global_step += 1
                if global_step >= max_steps:
                    return


def _dataset(loader):
    """The dataset under a loader the recorder watches."""
    return getattr(loader, "dataset", None) or getattr(loader, "loader").dataset


def window_buffer(m, opt, load, K, epochs, mean, items, summed):
    """The window kept in a list that is not emptied at the epoch's end
    (issue 44's new-user SFT loop): an epoch's leftover micro-batches wait
    for the next epoch's first ones, and that window is divided by the
    items of all K; the run's last leftover is never backwarded
    (window-buffer-across-epochs)."""
    pending = []
    for _ in range(epochs):
        for b in load():
            pending.append(b)
            if len(pending) == K:
                n = sum(items(x) for x in pending)
                for x in pending:
                    (summed(m, x) / n).backward()
                opt.step()
                opt.zero_grad()
                pending = []


def window_sum(m, opt, load, K, epochs, mean, items, summed):
    """A running gradient sum and item count not reset at the epoch's end
    (torchtune 0.6.1's recipe loop): each micro-batch's mean times its
    items backwarded as it comes, the gradients scaled by 1/count and
    stepped at `(i + 1) % K == 0` on the epoch's own index, the count reset
    only there: an epoch's leftover joins the next epoch's first K
    micro-batches, all over the joined count; the run's last leftover is
    backwarded and never stepped (window-sum-across-epochs)."""
    n = 0
    for _ in range(epochs):
        for i, b in enumerate(load()):
            n += items(b)
            (mean(m, b) * items(b)).backward()
            if (i + 1) % K == 0:
                for p in m.parameters():
                    if p.grad is not None:
                        p.grad.mul_(1 / n)
                opt.step()
                opt.zero_grad()
                n = 0


LOOPS = {f.__name__: f for f in (transformers, lightning, mean_over_k, no_div_k,
                                  summed_over_k, zero_grad_inside, step_outside_if, rescaled_accumulator,
                                  off_by_one, leak, skip_short, double_count,
                                  clip_per_micro_step, double_count_last,
                                  step_first_alone, across_epochs_k_twice, unshifted_count,
                                  across_epochs_k_twice_drop_last, trainer_4_46,
                                  window_buffer, window_sum)}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patch", choices=["closure"], default=None,
                    help="closure: model.forward replaced by a function closing over the "
                    "model's bound forward (as TRL's SFTTrainer patches it: models.py)")
    ap.add_argument("--model", choices=["gpt", "sft", "cnn", "fused"], default="gpt",
                    help="gpt: the decoder on shifted labels; sft: on unshifted labels with "
                    "prompts masked with -100 (the recorder given unshifted_count_fn); cnn; "
                    "fused: the decoder whose forward(idx, labels) computes the summed loss "
                    "itself, a chunked fused linear + cross-entropy head (models.FusedGPT)")
    ap.add_argument("--loop", choices=sorted(LOOPS), default="transformers")
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--told-K", type=int, default=None,
                    help="tell the recorder this K instead of --K (a recorder told the wrong K)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--optimizer", choices=["adamw", "adamw-fused", "sgd"], default="adamw",
                    help="adamw-fused: AdamW(fused=True), which unscales a GradScaler's "
                         "gradient inside its step")
    ap.add_argument("--schedule", choices=["constant", "linear", "linear-early", "linear-x-k",
                                           "linear-steps", "linear-micro", "step-freq2",
                                           "step-freq2-micro", "cosine", "cosine-budget"],
                    default="constant",
                    help="linear: get_linear_schedule_with_warmup (warmup 2, total 12), "
                    "declared; linear-early: the same with scheduler.step() before "
                    "optimizer.step(); linear-x-k: the same with lr x K (the linear "
                    "scaling rule), the schedule declared at the base lr; linear-steps: "
                    "no warmup, total = the run's optimizer steps (epochs x "
                    "ceil(len(loader) / K)), declared; linear-micro: declared the same, "
                    "built with num_training_steps = len(loader) * epochs "
                    "(schedule-horizon-in-micro-steps; len(loader) need not be a multiple "
                    "of K); step-freq2: StepLR(step_size=1, gamma=0.8) stepped after every "
                    "2nd optimizer step, declared so (Lightning's {'interval': 'step', "
                    "'frequency': 2}); step-freq2-micro: declared the same, stepped after "
                    "the steps whose window ends on an even micro-batch of the epoch "
                    "(Lightning's (batch_idx + 1) % frequency, #17544); cosine: "
                    "get_cosine_schedule_with_warmup (warmup 2, total = the run's optimizer "
                    "steps), declared; cosine-budget: declared the same, built with "
                    "num_training_steps = epochs x (len(loader) // K), Transformers 4.45-4.51's "
                    "step budget (step-budget-drops-micro-batches)")
    ap.add_argument("--clip", type=float, default=None,
                    help="clip_grad_norm_(max_norm) before each optimizer.step(), declared")
    ap.add_argument("--undeclared-clip", action="store_true",
                    help="clip, but do not declare it to the recorder")
    ap.add_argument("--kwargs", action="store_true",
                    help="batches are dicts and the model is called with keywords only, "
                         "model(idx=batch['idx']), as Transformers models are called with model(**batch)")
    ap.add_argument("--compile", action="store_true",
                    help="train the torch.compile'd model (the recorder watches the module it wraps)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend (inductor, or aot_eager: the same graph capture and "
                         "compiled backward without inductor's code generation)")
    ap.add_argument("--autocast", choices=["bf16", "fp16"], default=None,
                    help="the loop under torch.autocast('cpu', dtype) (mixed precision)")
    ap.add_argument("--scaler", action="store_true",
                    help="torch.amp.GradScaler('cpu'): scaler.scale(loss).backward(), "
                         "unscale_ before the clip, scaler.step(opt), scaler.update()")
    ap.add_argument("--overflow-at", type=int, default=None, metavar="W",
                    help="with --scaler: window W's first loss times inf, so its gradient "
                         "overflows and GradScaler skips the window")
    ap.add_argument("--after-overflow", choices=["skip", "step_anyway", "no_zero"],
                    default="skip",
                    help="skip: scaler.step/update, zero_grad (correct); step_anyway: "
                         "unscale_, optimizer.step() past the scaler, update; no_zero: "
                         "zero_grad only after a window that stepped")
    ap.add_argument("--digest", default=None, metavar="FILE",
                    help="write the SHA-256 of the trained parameters to FILE (the run "
                         "recorded and not must give the same)")
    ap.add_argument("--plain-digest", default=None, metavar="FILE",
                    help="first run the same loop without the recorder in this process and write "
                    "the SHA-256 of its trained parameters to FILE (with --digest: the run "
                    "recorded and not, one process)")
    ap.add_argument("--out", default=None, help="trace folder (contract tier)")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--interrupt-after", type=int, metavar="N",
                    help="a KeyboardInterrupt after the N-th optimizer step, as Ctrl-C would "
                         "raise (the recorder then writes no trace: docs/trace-format.md)")
    return ap.parse_args(argv)


class Counted:
    """An epoch's loader whose iteration tells the Stepping how many
    micro-batches the epoch has drawn (its `in_epoch`)."""

    def __init__(self, loader, stepping):
        self.loader, self.stepping = loader, stepping

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        self.stepping.in_epoch = 0
        for b in self.loader:
            self.stepping.in_epoch += 1
            yield b


class Stepping:
    """The optimizer as the loops see it: zero_grad, step -- with the
    scheduler and the clip of the chosen variant around step."""

    def __init__(self, opt, model, scheduler=None, early=False, clip=None, max_norm=None,
                 interrupt_after=None, scaler=None):
        self.opt, self.model, self.scheduler, self.early, self.clip = opt, model, scheduler, early, clip
        self.scaler = scaler
        self.max_norm = max_norm  # for a loop that clips by itself
        self.steps, self.interrupt_after = 0, interrupt_after

    after_overflow = "skip"
    skipped = False  # the last window's scale went down: GradScaler skipped it
    # Whether scheduler.step() follows this optimizer step (None: always);
    # in_epoch: the micro-batches drawn in the epoch so far (Counted).
    every = None
    in_epoch = 0

    def zero_grad(self):
        if self.after_overflow == "no_zero" and self.skipped:
            return  # zeroes only after a window that stepped
        self.opt.zero_grad()

    def step(self):
        if self.scaler is not None and self.clip is not None:
            self.scaler.unscale_(self.opt)
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        if self.scheduler is not None and self.early:
            self.scheduler.step()
        if self.scaler is not None and self.after_overflow == "step_anyway":
            self.scaler.unscale_(self.opt)
            self.opt.step()  # past the scaler: inf or NaN stepped
            self.scaler.update()
        elif self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.opt)
            self.scaler.update()
            self.skipped = self.scaler.get_scale() < scale
        else:
            self.opt.step()
        if self.scheduler is not None and not self.early and \
                (self.every is None or self.every(self)):
            self.scheduler.step()
        self.steps += 1
        if self.steps == self.interrupt_after:
            raise KeyboardInterrupt  # Ctrl-C mid-run


def run(a):
    """One run of the chosen loop; returns (wall, cpu) seconds of the loop
    (and the recorder's close)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if a.model == "gpt":
        model, data = models.TinyGPT(), models.gpt_data(n=a.samples or 42)
        summed, items, mean = models.gpt_summed_loss, models.gpt_items, models.gpt_mean_loss
        kind = "tokens"
    elif a.model == "fused":
        model, data = models.FusedGPT(), models.gpt_data(n=a.samples or 42)
        summed, items, mean = models.fused_summed_loss, models.gpt_items, models.fused_mean_loss
        kind = "tokens"
    elif a.model == "sft":
        model, data = models.TinyGPT(), models.sft_data(n=a.samples or 42)
        summed, items, mean = models.sft_summed_loss, models.sft_items, models.sft_mean_loss
        kind = "tokens"
    else:
        model, data = models.TinyCNN(), models.cnn_data(n=a.samples or 32)
        summed, items = models.cnn_summed_loss, models.cnn_items
        mean = lambda mm, b: summed(mm, b) / items(b)  # noqa: E731
        kind = "samples"
    if a.patch == "closure":
        models.forward_in_closure(model)
    if a.kwargs:
        # Dict batches, keyword-only calls of the model.
        data = [{"idx": x, "labels": y} for x, y in data]
        summed, items, mean = (
            (lambda f: lambda m, b: f(lambda x: m(idx=x), (b["idx"], b["labels"])))(summed),
            (lambda f: lambda b: f((b["idx"], b["labels"])))(items),
            (lambda f: lambda m, b: f(lambda x: m(idx=x), (b["idx"], b["labels"])))(mean))
    model.train()
    lr = 1e-3 if a.optimizer.startswith("adamw") else 0.05
    lr_used = lr * a.K if a.schedule == "linear-x-k" else lr
    if a.optimizer.startswith("adamw"):
        opt = torch.optim.AdamW(model.parameters(), lr=lr_used, weight_decay=0.01,
                                fused=a.optimizer == "adamw-fused")
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr_used, momentum=0.9)
    scheduler, schedule = None, None
    if a.schedule in ("linear-steps", "linear-micro"):
        micro = -(-len(data) // a.micro_batch)  # len(loader)
        steps = a.epochs * -(-micro // a.K)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            opt, warmup_linear(0, steps) if a.schedule == "linear-steps"
            else warmup_linear(0, micro * a.epochs))
        schedule = {"kind": "linear", "warmup": 0, "total": steps}
    elif a.schedule in ("cosine", "cosine-budget"):
        micro = -(-len(data) // a.micro_batch)  # len(loader)
        steps = a.epochs * -(-micro // a.K)
        horizon = steps if a.schedule == "cosine" else _trainer_budget(micro, a.K, a.epochs)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, models.warmup_cosine(2, horizon))
        schedule = {"kind": "cosine", "warmup": 2, "total": steps}
    elif a.schedule.startswith("step-freq2"):
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
        schedule = Cadence(scheduler, "step", 2)
    elif a.schedule != "constant":
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear(2, 12))
        schedule = {"kind": "linear", "warmup": 2, "total": 12}
    rec = None
    if not a.no_record:
        rec = ContractRecorder(model, opt, summed, items, accumulation=a.told_K or a.K,
                               out=a.out or "trace", items=kind, lr=lr, schedule=schedule,
                               clip=None if a.undeclared_clip else a.clip,
                               unshifted_count_fn=(models.sft_unshifted_items
                                                   if a.model == "sft" else None))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if a.scaler else None
    stepping = Stepping(opt, model, scheduler, a.schedule == "linear-early",
                        None if a.loop == "clip_per_micro_step" else a.clip, a.clip,
                        a.interrupt_after, scaler)
    stepping.after_overflow = a.after_overflow
    if a.schedule == "step-freq2":
        stepping.every = lambda s: (s.steps + 1) % 2 == 0
    elif a.schedule == "step-freq2-micro":
        stepping.every = lambda s: s.in_epoch % 2 == 0
    if scaler is not None:
        # The loop backwards the scaled loss; the recorder keeps the summed
        # one.  --overflow-at W: window W's first loss times inf.
        overflow = {"at": a.overflow_at}

        def scaled(f):
            def loss(m, b):
                out = scaler.scale(f(m, b))
                if overflow["at"] is not None and stepping.steps == overflow["at"]:
                    overflow["at"] = None
                    out = out * float("inf")
                return out
            return loss
        summed_loop, mean = scaled(summed), scaled(mean)
    else:
        summed_loop = summed
    shuffler = torch.Generator().manual_seed(1)

    def load(drop_last=False):
        loader = DataLoader(data, batch_size=a.micro_batch, shuffle=True,
                            generator=shuffler, drop_last=drop_last)
        loader = rec.watch(loader) if rec else loader
        return Counted(loader, stepping) if a.schedule == "step-freq2-micro" else loader

    trained = torch.compile(model, backend=a.compile_backend) if a.compile else model
    amp = contextlib.nullcontext() if a.autocast is None else torch.autocast(
        "cpu", dtype=torch.bfloat16 if a.autocast == "bf16" else torch.float16)
    t0, c0 = time.perf_counter(), time.process_time()
    with amp:
        LOOPS[a.loop](trained, stepping, load, a.K, a.epochs, mean, items, summed_loop)
    if rec:
        rec.close()
    if a.digest:
        # The plain run (--plain-digest) comes first: its folder may not be
        # made yet.
        os.makedirs(os.path.dirname(os.path.abspath(a.digest)), exist_ok=True)
        with open(a.digest, "w") as f:
            f.write(digest(model) + "\n")
    return time.perf_counter() - t0, time.process_time() - c0


def digest(model):
    """SHA-256 of the model's parameters and buffers, bit for bit."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main():
    a = parse()
    if a.plain_digest and not a.no_record:
        plain = copy.copy(a)
        plain.no_record, plain.digest, plain.plain_digest = True, a.plain_digest, None
        run(plain)
        if a.compile:
            torch._dynamo.reset()  # the recorded run compiles afresh, as in a process of its own
    dt, dc = run(a)
    if not a.quiet:
        print("%s %s K=%d: %.3f s wall, %.3f s cpu%s" % (a.model, a.loop, a.K, dt, dc,
                                                       "" if not a.no_record else " (not recorded)"))


if __name__ == "__main__":
    exit_on_refusal(main)
