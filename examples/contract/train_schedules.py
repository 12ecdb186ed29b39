"""Training loops with lr schedules as users write them, on the GPT-style
decoder (models.py), recorded for the contract tier with the schedule
declared in the form the loop already has it (docs/tiers.md "Declaring the
lr schedule").

    train_schedules.py --loop nanogpt --out trace/
    accumcheck certify --contract --trace trace/

The schedules: nanoGPT's get_lr as a LambdaLR factor (linear warmup
(s+1)/(w+1), cosine down to a floor of 0.1 x lr, the floor held past the
horizon), and PyTorch's OneCycleLR.  The loops: the correct ones, the
scheduler stepped per micro-step (after the boundary's step, and right
after each backward, before the step), the 2021 Hugging Face
run_clm_no_trainer loop, and a loss mistake beside a scheduler mistake.
--no-record: the same run without the recorder; --identity PATH: without
it, then with it, in this process (the trained parameters must be the
same bits: identity.py)."""

import argparse
import math

import torch
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR
from torch.utils.data import DataLoader

import identity
import models
from accumcheck_torch import ContractRecorder, exit_on_refusal

WARMUP, HORIZON = 2, 5


def nanogpt_factor(warmup=WARMUP, horizon=HORIZON, floor=0.1):
    """nanoGPT's get_lr(it) / learning_rate: warmup (it+1)/(warmup+1), then
    a cosine from 1 down to `floor` at `horizon`, `floor` after it."""
    def f(it):
        if it < warmup:
            return (it + 1) / (warmup + 1)
        if it > horizon:
            return floor
        ratio = (it - warmup) / (horizon - warmup)
        return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - floor)
    return f


# ---- correct loops: the window's token count before its first backward

def nanogpt(m, opt, sched, load, K, epochs, mean, items, summed):
    """nanoGPT's micro-step loop, with the window's summed loss over its
    tokens; the scheduler after the step."""
    for _ in range(epochs):
        batches = list(load())
        for w in range(0, len(batches), K):
            window = batches[w:w + K]
            n = sum(items(b) for b in window)
            for b in window:
                (summed(m, b) / n).backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)


def _counted(loader, K):
    """(i, batch, the token count of i's window) over a loader drawn whole."""
    batches = list(loader)
    for i, b in enumerate(batches):
        w0 = i - i % K
        yield i, b, len(batches), batches[w0:w0 + K]


def per_micro(m, opt, sched, load, K, epochs, mean, items, summed):
    """scheduler.step() at the bottom of the micro-batch loop, outside the
    `if`: K scheduler steps per optimizer step."""
    for _ in range(epochs):
        for i, b, n_b, window in _counted(load(), K):
            (summed(m, b) / sum(items(x) for x in window)).backward()
            if (i + 1) % K == 0 or i + 1 == n_b:
                opt.step()
                opt.zero_grad()
            sched.step()


def per_micro_early(m, opt, sched, load, K, epochs, mean, items, summed):
    """scheduler.step() right after every backward, before the `if` that
    steps the optimizer."""
    for _ in range(epochs):
        for i, b, n_b, window in _counted(load(), K):
            (summed(m, b) / sum(items(x) for x in window)).backward()
            sched.step()
            if (i + 1) % K == 0 or i + 1 == n_b:
                opt.step()
                opt.zero_grad()


def mean_over_k_per_micro(m, opt, sched, load, K, epochs, mean, items, summed):
    """Two mistakes: each micro-batch's token mean / K (Transformers before
    4.46) and the scheduler stepped per micro-step."""
    for _ in range(epochs):
        for i, b, n_b, window in _counted(load(), K):
            (mean(m, b) / K).backward()
            if (i + 1) % K == 0 or i + 1 == n_b:
                opt.step()
                opt.zero_grad()
            sched.step()


def hf_2021(m, opt, sched, load, K, epochs, mean, items, summed):
    """run_clm_no_trainer.py as of 2021 (Transformers examples): `step %
    gradient_accumulation_steps == 0` on the 0-based step, a step at the
    epoch's last batch, and a break at max_train_steps, computed as
    epochs x ceil(len(loader) / K)."""
    loader = load()
    max_train_steps = epochs * math.ceil(len(loader) / K)
    completed_steps = 0
    for _ in range(epochs):
        for step, batch in enumerate(loader):
            loss = mean(m, batch)  # outputs.loss: the batch's token mean
            loss = loss / K
            loss.backward()  # accelerator.backward(loss)
            if step % K == 0 or step == len(loader) - 1:
                opt.step()
                sched.step()
                opt.zero_grad()
                completed_steps += 1
            if completed_steps >= max_train_steps:
                break


LOOPS = {f.__name__: f for f in (nanogpt, per_micro, per_micro_early,
                                  mean_over_k_per_micro, hf_2021)}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", choices=sorted(LOOPS), default="nanogpt")
    ap.add_argument("--schedule", choices=["nanogpt", "onecycle"], default="nanogpt")
    ap.add_argument("--declare", choices=["lambda", "factory", "scaled-factory", "object"],
                    default="lambda",
                    help="how the schedule is declared: its lr_lambda, a factory of the "
                    "optimizer, a factory of (optimizer, scale), or the scheduler object")
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=42)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--out", default="trace")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--no-record", action="store_true", help="the same run without the recorder")
    ap.add_argument("--identity", metavar="PATH",
                    help="train without the recorder, then with it, in this process; write "
                    "both runs' parameter digests to PATH.rank0 (identity.py)")
    return ap.parse_args(argv)


def run(a):
    if a.quiet:
        # PyTorch's warning for scheduler.step() before optimizer.step()
        # (the per-micro-step loops): --quiet prints nothing.
        import warnings
        warnings.filterwarnings("ignore", "Detected call of")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, data = models.TinyGPT(), models.gpt_data(n=a.samples)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    if a.schedule == "nanogpt":
        sched = LambdaLR(opt, nanogpt_factor())
        declared = {
            "lambda": nanogpt_factor(),
            "factory": lambda o: LambdaLR(o, nanogpt_factor()),
            "scaled-factory": lambda o, scale: LambdaLR(
                o, nanogpt_factor(WARMUP * scale, HORIZON * scale)),
            "object": sched,
        }[a.declare]
    else:
        steps = a.epochs * math.ceil(math.ceil(a.samples / a.micro_batch) / a.K)
        sched = OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
        declared = {
            "factory": lambda o: OneCycleLR(o, max_lr=2e-3, total_steps=steps),
            "scaled-factory": lambda o, scale: OneCycleLR(o, max_lr=2e-3,
                                                          total_steps=steps * scale),
            "object": sched,
        }[a.declare]
    rec = None if a.no_record else ContractRecorder(
        model, opt, models.gpt_summed_loss, models.gpt_items, accumulation=a.K, out=a.out,
        items="tokens", schedule=declared)
    shuffler = torch.Generator().manual_seed(1)

    def load():
        loader = DataLoader(data, batch_size=a.micro_batch, shuffle=True, generator=shuffler)
        return rec.watch(loader) if rec is not None else loader

    LOOPS[a.loop](model, opt, sched, load, a.K, a.epochs, models.gpt_mean_loss,
                  models.gpt_items, models.gpt_summed_loss)
    if rec is not None:
        rec.close()
    return model


if __name__ == "__main__":
    args = parse()
    if args.identity:
        exit_on_refusal(identity.twice, lambda rank, ranks, a: run(a), args.identity, 0, 1, args)
    else:
        exit_on_refusal(run, args)
