"""Tiny models and data built in code for the framework cases (no hub
download): a classifier MLP and a causal token model, each a plain
nn.Module whose forward takes no **kwargs, and variable-length token data
padded with -100 so token counts differ between micro-batches."""

import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=16, classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class TinyLM(nn.Module):
    """Token embedding, a causal mixing layer (cumulative mean of the
    embeddings: position t sees tokens <= t), a tanh MLP and a head."""

    def __init__(self, vocab=17, d=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids):
        e = self.emb(input_ids)
        steps = torch.arange(1, e.shape[1] + 1, dtype=e.dtype).view(1, -1, 1)
        h = torch.tanh(self.mix(e.cumsum(1) / steps))
        return self.head(h)


def classifier_data(n=40, d_in=8, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return [(x[i], y[i]) for i in range(n)]


def token_data(n=40, T=10, vocab=17, seed=0):
    """Sequences of length 3..T, right-padded with 0 (input) and -100
    (labels)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(3, T + 1, (1,), generator=g))
        ids = torch.zeros(T, dtype=torch.long)
        ids[:L] = torch.randint(1, vocab, (L,), generator=g)
        labels = torch.full((T,), -100, dtype=torch.long)
        labels[:L] = ids[:L]
        out.append({"input_ids": ids, "labels": labels})
    return out


def warmup_linear(warmup, total):
    """The lambda of a linear schedule with warmup, as accumcheck's
    declared {"kind": "linear"} schedule and Transformers'
    get_linear_schedule_with_warmup compute it (0 at step 0)."""
    def f(n):
        if n < warmup:
            return n / max(1, warmup)
        return max(0.0, (total - n) / max(1, total - warmup))
    return f


def token_mean_loss(logits, labels):
    """The everyday causal-LM loss: the token mean of the shifted
    cross-entropy (what a model's forward returns as .loss)."""
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                       ignore_index=-100)


def _rank(rank, ranks, port, main, argv):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if main(argv) != 0:
        raise SystemExit(1)


def spawn(main, argv, ranks):
    """Runs main(argv) in `ranks` processes (torch.multiprocessing, the
    torch.distributed environment of a free local port set in each, as
    `accelerate launch` or torchrun would), or in this one when ranks is
    1 or this already is a rank."""
    if ranks <= 1 or "WORLD_SIZE" in os.environ:
        return main(argv)
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(ranks, port, main, argv), nprocs=ranks, join=True)
    return 0


def args(variants, argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", choices=variants, default=variants[0])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--no-record", action="store_true", help="the same run without recording")
    return ap.parse_args(argv)
