"""Real models for the contract tier's examples: a small GPT-style decoder
and a small CNN with BatchNorm2d, their data, the two functions a user
writes (summed item loss, item count), and the two pieces of Transformers'
loop the trainers use (its windows, its linear warmup).  Nothing here knows
accumcheck (bench/recorder_scale.py's plain runs import no accumcheck)."""

import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD = 0
IGNORE = -100


class Block(nn.Module):
    def __init__(self, d, heads, ctx, p):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // h)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Token + position embeddings, 2 blocks of causal self-attention and a
    GELU MLP, LayerNorm, dropout 0.1, output head tied to the embedding."""

    def __init__(self, vocab=64, d=64, heads=4, ctx=16, layers=2, p=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(Block(d, heads, ctx, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T)))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.tok.weight.t()  # tied head


class FusedGPT(TinyGPT):
    """TinyGPT with a fused head, as Liger's fused linear cross-entropy or a
    Transformers model given labels has it: forward(idx, labels) returns
    the summed token loss computed inside the forward, CHUNK positions at
    a time (the whole logits tensor never exists); forward(idx) the
    logits."""

    CHUNK = 16

    def forward(self, idx, labels=None):
        T = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T)))
        for b in self.blocks:
            x = b(x)
        h = self.ln(x).reshape(-1, x.shape[-1])
        if labels is None:
            return (h @ self.tok.weight.t()).view(idx.shape[0], T, -1)
        y = labels.reshape(-1)
        return sum(F.cross_entropy(h[i:i + self.CHUNK] @ self.tok.weight.t(), y[i:i + self.CHUNK],
                                   ignore_index=IGNORE, reduction="sum")
                   for i in range(0, h.shape[0], self.CHUNK))


def fused_summed_loss(model, batch):
    """The fused head's summed token loss: model(inputs, labels=labels)."""
    x, y = batch
    return model(x, labels=y)


def fused_mean_loss(model, batch):
    return fused_summed_loss(model, batch) / gpt_items(batch)


def forward_in_closure(model):
    """model.forward replaced by a function closing over the model's own
    bound forward (as TRL's SFTTrainer and other wrappers patch it): a
    deep copy of the model keeps calling THIS model's forward."""
    inner = model.forward

    def forward(*args, **kwargs):
        return inner(*args, **kwargs)
    model.forward = forward
    return model


def gpt_data(n=42, ctx=16, vocab=64, seed=0):
    """n sequences of lengths 3..ctx (long-tailed), padded; (inputs, labels)
    pairs with the padding's labels IGNORE."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = int(3 + (ctx - 3) * float(torch.rand(1, generator=g)) ** 3)
        seq = torch.randint(1, vocab, (L + 1,), generator=g)
        x = torch.full((ctx,), PAD, dtype=torch.long)
        y = torch.full((ctx,), IGNORE, dtype=torch.long)
        x[:L], y[:L] = seq[:L], seq[1:]
        out.append((x, y))
    return out


def gpt_summed_loss(model, batch):
    """The sum of the per-token losses over the loss-bearing tokens."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def gpt_items(batch):
    return int((batch[1] != IGNORE).sum())


def sft_data(n=42, ctx=16, vocab=64, seed=0):
    """Supervised fine-tuning data as Transformers has it: n sequences of
    lengths 3..ctx (long-tailed), padded; labels UNSHIFTED (the loss shifts
    them: position i predicts label i+1), the prompt's labels masked with
    IGNORE (a prompt of 0 to L-2 tokens: some sequences' first label is
    counted, most are not) and the padding's."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = int(3 + (ctx - 3) * float(torch.rand(1, generator=g)) ** 3)
        seq = torch.randint(1, vocab, (L,), generator=g)
        prompt = int(torch.randint(0, L - 1, (1,), generator=g))
        x = torch.full((ctx,), PAD, dtype=torch.long)
        y = torch.full((ctx,), IGNORE, dtype=torch.long)
        x[:L], y[prompt:L] = seq, seq[prompt:]
        out.append((x, y))
    return out


def sft_summed_loss(model, batch):
    """The sum of the next-token losses: logits at i against labels at i+1."""
    x, y = batch
    logits = model(x)[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def sft_items(batch):
    """The labels that carry a loss: labels[:, 1:] not IGNORE."""
    return int((batch[1][:, 1:] != IGNORE).sum())


def sft_unshifted_items(batch):
    """The count over the UNSHIFTED labels (position 0 too): what a loop
    that forgets the shift divides by (token-count-unshifted-labels)."""
    return int((batch[1] != IGNORE).sum())


def sft_mean_loss(model, batch):
    return sft_summed_loss(model, batch) / sft_items(batch)


def gpt_mean_loss(model, batch):
    """What a Transformers model returns: the mean over the batch's tokens."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                           ignore_index=IGNORE)


class TinyCNN(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


def cnn_data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(n, 1, 16, 16, generator=g)
    ys = torch.randint(0, 4, (n,), generator=g)
    return list(zip(xs, ys))


def cnn_summed_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum")


def cnn_items(batch):
    return int(batch[1].shape[0])


def windows(loader, K):
    """Transformers' _inner_training_loop: each window's batches are drawn
    first, so num_items_in_batch is known before the first backward; the
    epoch's last window may be short."""
    it = iter(loader)
    while True:
        batch = list(itertools.islice(it, K))
        if not batch:
            return
        yield batch


def warmup_linear(warmup, total):
    """Transformers' get_linear_schedule_with_warmup's lambda."""
    def f(n):
        if n < warmup:
            return n / max(1, warmup)
        return max(0.0, (total - n) / max(1, total - warmup))
    return f


def warmup_cosine(warmup, total):
    """Transformers' get_cosine_schedule_with_warmup's lambda (0.5 cycles)."""
    def f(n):
        if n < warmup:
            return n / max(1, warmup)
        progress = (n - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return f
