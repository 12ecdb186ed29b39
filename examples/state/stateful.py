"""Training loops that keep state beyond gradients (accumcheck state
examples), on the certify-batchnorm bundle: a BatchNorm MLP of its own,
its own DataLoader, Adam, an EMA of the weights
(torch.optim.swa_utils.AveragedModel) and a logged loss.

    python3 stateful.py --bundle BUNDLE --out TRACE --variant correct
    variants: correct,
              ema_per_micro (ema.update_parameters() after every backward),
              adam_step_per_micro (Adam's state['step'] kept equal to a
              global step that counts micro-batches: keras #19990's t),
              log_times_k (logs loss.item() * K summed over the window:
              the per-micro-batch means summed, K x the window's mean),
              log_last_micro (logs the last micro-batch's loss only)
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import DataLoader

from accumcheck_torch import exit_on_refusal, load_bundle, Recorder

EMA_DECAY = 0.9


class Net(nn.Module):
    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.bn1 = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn1(self.fc1(x))))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", default="correct",
                    choices=["correct", "ema_per_micro", "adam_step_per_micro",
                             "log_times_k", "log_last_micro"])
    args = ap.parse_args()

    bundle = load_bundle(args.bundle)
    model = Net(bundle.d_in, bundle.widths[1], bundle.d_out)
    bundle.load_initial(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=bundle.lr, betas=bundle.betas,
                                 eps=bundle.eps, weight_decay=bundle.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bundle.lr_multiplier)
    ema = AveragedModel(model, avg_fn=lambda avg, p, n: EMA_DECAY * avg + (1 - EMA_DECAY) * p)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out,
                        ema=ema, ema_decay=EMA_DECAY)

    K = bundle.accumulation
    loader = DataLoader(bundle.dataset(), batch_size=bundle.micro_batch, shuffle=False)
    global_step = 0
    for epoch in range(bundle.epochs):
        model.train()
        running = 0.0
        for i, (x, y, _) in enumerate(loader):
            loss = F.mse_loss(model(x), y) / K
            loss.backward()
            global_step += 1
            running += loss.item() * (K if args.variant == "log_times_k" else 1)
            if args.variant == "ema_per_micro":
                ema.update_parameters(model)
            if (i + 1) % K == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
                if args.variant == "adam_step_per_micro":
                    for state in optimizer.state.values():  # resume-safe step count
                        state["step"].fill_(global_step - 1)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                if args.variant != "ema_per_micro":
                    ema.update_parameters(model)
                recorder.log_loss(loss.item() if args.variant == "log_last_micro" else running)
                running = 0.0

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
