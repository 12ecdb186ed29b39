"""A correct loop on the trainer's own nn.Module (accumcheck example):
named submodules `encoder` and `head` instead of the bundle's
nn.Sequential.  The recorder maps its parameters to the scenario's tensors
by order and shape and prints the mapping; an extra eval forward under
no_grad at each epoch end is a note, not a failure.

    python3 train_own_module.py --bundle BUNDLE --out TRACE
"""

import torch
from torch import nn

from accumcheck_torch import exit_on_refusal, load_bundle, Recorder


class Regressor(nn.Module):
    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.encoder = nn.Linear(d_in, hidden)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.head(torch.tanh(self.encoder(x)))


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    bundle = load_bundle(args.bundle)
    model = Regressor(bundle.d_in, bundle.widths[1], bundle.d_out)
    bundle.load_initial(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=bundle.lr, momentum=bundle.momentum,
                                weight_decay=bundle.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bundle.lr_multiplier)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out)

    criterion = nn.MSELoss(reduction="sum")
    for epoch in range(bundle.epochs):
        model.train()
        for window in bundle.windows(epoch):
            n_w = sum(len(ids) for ids in window)
            for ids in window:
                x, y = bundle.x[ids], bundle.y[ids]
                loss = criterion(model(x), y) / (bundle.d_out * n_w)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            model(bundle.x)  # validation

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)
