"""A trainer written the way people write one, outside accumcheck's tree,
and certified through the pytest plugin after `pip install accumcheck`
(tests/package/wheel_install.sh copies this file and test_user_trainer.py
into a fresh folder).  Its own model and DataLoader, K micro-batches per
optimizer step, each micro-batch's summed loss divided by its window's
sample count.  mistake=True divides by K x the micro-batch size instead:
the same on full windows, wrong on the epoch's short last window (the
partial-window pitfall of a loop that divides by K)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


def summed_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="sum")


def items(batch):
    return len(batch[1])


def build():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    data = TensorDataset(torch.randn(44, 6), torch.randint(0, 3, (44,)))
    loader = DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    return model, optimizer, loader


def window_items(loader, i, K):
    """The samples in micro-batch i's window (the last batch of an epoch
    may be short, and so may its window)."""
    n, b, total = len(loader), loader.batch_size, len(loader.dataset)
    start = (i // K) * K
    return sum(min(b, total - j * b) for j in range(start, min(start + K, n)))


def train(model, optimizer, loader, batches=None, K=4, epochs=2, mistake=False):
    """batches: what the loop iterates (the loader, or a recorder's view of it)."""
    for _ in range(epochs):
        n = len(loader)
        for i, batch in enumerate(batches or loader):
            divisor = K * loader.batch_size if mistake else window_items(loader, i, K)
            (summed_loss(model, batch) / divisor).backward()
            if (i + 1) % K == 0 or i + 1 == n:
                optimizer.step()
                optimizer.zero_grad()
