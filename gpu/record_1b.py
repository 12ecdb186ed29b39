"""The contract recorder on a GPU (issue 43 part 7): a fine-tune of a
decoder of about 1.07B parameters (20 blocks of width 2048, a 32000-token
vocabulary, GPT-2's layout, built from the config below; nothing is
downloaded), trained by a Transformers-style loop on CUDA under bf16
autocast (float32 parameters, AdamW, clip_grad_norm_(1.0), K = 16
micro-batches of 4 x 512 tokens a step), plain and then recorded by
ContractRecorder exactly as docs/tiers.md shows it, in one process.

Per run: one warm-up optimizer step (not timed), then --steps steps timed
(wall clock, torch.cuda.synchronize() around them); the recorded run's
time includes rec.close().  Reported: seconds per step both ways and their
ratio, the peak device memory (torch.cuda.max_memory_allocated over the
whole run) both ways and the difference, the host's peak RSS, whether the
trained parameters are the same bits with and without the recorder (the
sha256 of the state_dict), and certify's verdict on the trace where
--certify names the binary (else the trace is left in --out for
`accumcheck certify --contract --trace OUT/trace-bf16` elsewhere: it holds
K + 2 rows of the sampled coordinates a step, a few MB).

    python3 gpu/record_1b.py --out $OUT [--precision float32]   # on the GPU machine
    .venv/bin/python gpu/record_1b.py --dry-run --certify build/cli/accumcheck

--dry-run: the same script on the CPU at a tiny size (2 blocks of width
64, K = 4, 2 steps, autocast on the CPU), to check the script itself
before a GPU session spends its minutes on it; not a CI test.  Exit 1
when the runs are not bit-identical, certify (when run) does not PASS, or
the recorder ended its recording."""

import argparse
import gc
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# name -> (blocks, heads, width, vocabulary, positions)
CONFIGS = {
    "1B": (20, 16, 2048, 32000, 1024),
    "tiny": (2, 2, 64, 256, 64),
}
IGNORE = -100
DROPOUT, LR = 0.1, 1e-4


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.drop = heads, nn.Dropout(DROPOUT)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=DROPOUT if self.training else 0.0,
                                           is_causal=True)
        return self.drop(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class Decoder(nn.Module):
    """GPT-2's layout: token and position embeddings, pre-LayerNorm blocks,
    the head tied to the token embedding; GPT-2's initialization."""

    def __init__(self, blocks, heads, d, vocab, ctx):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.drop = nn.Dropout(DROPOUT)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, t in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(t)
            elif t.dim() > 1:
                std = 0.02 / math.sqrt(2 * blocks) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(t, 0.0, std)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def summed_loss(model, batch):
    """The summed token cross-entropy over the completion's tokens."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                           reduction="sum")


def items(batch):
    return int((batch[1] != IGNORE).sum())


def unshifted_items(batch):
    """The labels a loop that forgets the shift would count: the unshifted
    row starts with the first input token, always in the masked prompt
    here, so the same count (certify's token-count-unshifted-labels then
    predicts correct's weights: inert, not an alternative)."""
    return items(batch)


def batches(n, micro, seq, vocab):
    """n micro-batches of `micro` sequences of `seq` tokens on the host, a
    random prompt prefix of each masked out of the labels."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        seqs = torch.randint(1, vocab, (micro, seq + 1), generator=g)
        x, y = seqs[:, :-1].clone(), seqs[:, 1:].clone()
        for i in range(micro):
            y[i, :int(torch.randint(1, seq // 2, (1,), generator=g))] = IGNORE
        out.append((x, y))
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(a, device, record, trace):
    """One run: (seconds per timed step, peak device bytes, state digest,
    parameters, recorder's end or None)."""
    from accumcheck_torch import ContractRecorder

    blocks, heads, d, vocab, ctx = CONFIGS[a.size]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    with torch.device(device):
        model = Decoder(blocks, heads, d, vocab, ctx).train()
    P = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    data = batches((1 + a.steps) * a.k, a.micro_batch, a.seq, vocab)
    rec = None
    if record:
        rec = ContractRecorder(model, opt, summed_loss, items, accumulation=a.k, out=trace,
                               items="tokens", lr=LR, clip=1.0, quiet=True,
                               unshifted_count_fn=unshifted_items)
    loader = rec.watch(data) if rec is not None else data
    it = iter(loader)
    torch.manual_seed(2)
    t0 = None
    for step in range(1 + a.steps):
        if step == 1:
            sync(device)
            t0 = time.perf_counter()
        window = [next(it) for _ in range(a.k)]
        n_w = sum(items(b) for b in window)
        for x, y in window:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = summed_loss(model, (x, y)) / n_w
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if rec is not None:
        rec.close()
    sync(device)
    per_step = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    ended = None if rec is None else rec.abandoned
    del model, opt, rec, loader, it
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return per_step, peak, h.hexdigest(), P, ended


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="the tiny config on the CPU (K=4, 2 steps, micro-batch 2 x 32 tokens)")
    ap.add_argument("--size", choices=sorted(CONFIGS), default=None)
    ap.add_argument("--k", type=int, default=None, help="micro-batches a step (default 16)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 3)")
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences a micro-batch (4)")
    ap.add_argument("--seq", type=int, default=None, help="tokens a sequence (512)")
    ap.add_argument("--precision", choices=("bf16", "float32"), default="bf16",
                    help="bf16: the forward under torch.autocast(bfloat16) (default); float32: none")
    ap.add_argument("--out", default=None, help="folder for trace-PRECISION/ and record_1b-PRECISION.json")
    ap.add_argument("--certify", default=None, help="the accumcheck binary, to certify the trace")
    a = ap.parse_args()
    tiny = a.dry_run
    a.size = a.size or ("tiny" if tiny else "1B")
    a.k = a.k or (4 if tiny else 16)
    a.steps = a.steps or (2 if tiny else 3)
    a.micro_batch = a.micro_batch or (2 if tiny else 4)
    a.seq = a.seq or (32 if tiny else 512)
    if a.seq > CONFIGS[a.size][4] or min(a.k, a.steps, a.micro_batch, a.seq) < 1:
        ap.error("--k, --steps, --micro-batch, --seq >= 1 and --seq <= %d" % CONFIGS[a.size][4])
    device = torch.device("cpu" if tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device (--dry-run runs the tiny config on the CPU)")
    if device.type == "cuda":
        # cuBLAS's own workspace choice is reproducible with this; SDPA and
        # the other kernels take their deterministic paths where they have
        # one (a warning names any that has none).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = a.out or tempfile.mkdtemp(prefix="record_1b-")
    os.makedirs(out, exist_ok=True)
    trace = os.path.join(out, "trace-" + a.precision)
    say = lambda *m: print(*m, file=sys.stderr, flush=True)  # noqa: E731
    say("record_1b: %s on %s (%s), torch %s, %s, K=%d, %d steps of %d x %d tokens a micro-batch"
        % (a.size, device, torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
           torch.__version__, a.precision, a.k, a.steps, a.micro_batch, a.seq))
    res = {"size": a.size, "device": str(device), "torch": torch.__version__,
           "precision": a.precision, "K": a.k,
           "steps": a.steps, "micro_batch": a.micro_batch, "seq": a.seq}
    plain = train(a, device, False, trace)
    say("plain:    %.3f s/step, peak device memory %.0f MB" % (plain[0], plain[1] / 1e6))
    rss_plain = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    recorded = train(a, device, True, trace)
    say("recorded: %.3f s/step, peak device memory %.0f MB" % (recorded[0], recorded[1] / 1e6))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    res.update(parameters=plain[3], plain_s_per_step=plain[0], recorded_s_per_step=recorded[0],
               time_x=recorded[0] / plain[0], plain_peak_device_MB=plain[1] / 1e6,
               recorded_peak_device_MB=recorded[1] / 1e6,
               extra_device_MB=(recorded[1] - plain[1]) / 1e6,
               host_peak_rss_MB_after_plain=rss_plain / 1e6, host_peak_rss_MB=rss / 1e6,
               identical=plain[2] == recorded[2], recorder_ended=recorded[4])
    if not res["identical"]:
        # Is the plain run itself reproducible (a kernel without a
        # deterministic path), or did the recorder change the run?
        again = train(a, device, False, os.path.join(out, "unused"))
        res["plain_reproducible"] = again[2] == plain[2]
    ok = res["identical"] and recorded[4] is None
    if a.certify and recorded[4] is None:
        p = subprocess.run([a.certify, "certify", "--contract", "--trace", trace],
                           capture_output=True, text=True, check=False)
        verdict = [ln for ln in p.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
        res["certify"] = "exit %d %s" % (p.returncode, verdict[-1] if verdict else "")
        ok = ok and p.returncode == 0
        say(p.stdout[-3000:] + p.stderr[-2000:])
    with open(os.path.join(out, "record_1b-%s.json" % a.precision), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
