"""The contract-tier recorder at the scale gradient accumulation exists for
(issue 43): a GPT-2-style decoder of about 1M, 10M, 40M, 124M (GPT-2
small) and 355M (GPT-2 medium) parameters, trained by a Transformers-style
loop (sequence <= 64, micro-batch 2, prompt-masked labels, uneven lengths
padded; loss = summed token cross-entropy / the window's tokens; AdamW,
clip_grad_norm_(1.0), a linear-warmup LambdaLR, K micro-batches a step),
plain and recorded by ContractRecorder as docs/tiers.md shows it.

Each run is a fresh subprocess on one thread (torch.set_num_threads(1),
OMP/OPENBLAS/MKL_NUM_THREADS=1), so its peak RSS is its own (the child's
getrusage(RUSAGE_SELF).ru_maxrss).  A run takes one warm-up optimizer step
(not timed), then --steps steps timed with time.process_time; a recorded
run's time includes rec.close() (the recompute and fits it defers, and the
trace).  Per case: plain first (its memory sizes the --budget-gb guard),
then recorded and plain alternately, --repeats of each, the least of each;
then `accumcheck certify --contract` on the last recorded trace (verdict,
CPU time), and the sha256 of the trained state_dict of every run: the
recorder must leave training bit-identical.

    OMP_NUM_THREADS=1 .venv/bin/python bench/recorder_scale.py --build build \\
        [--sizes 1M,10M,40M,124M,350M] [--ks 4,16,64] [--steps 2] [--repeats 3] \\
        [--budget-gb 20] [--law auto|'(16*K+88)*P'] [--autocast bf16] \\
        [--out results.csv|results.md]

--autocast bf16 runs each micro-batch's forward and loss (not the
backward, the clip or the step) under torch.autocast("cpu",
dtype=torch.bfloat16), as Transformers' bf16=True does, plain and recorded.

Progress goes to stderr, the table (markdown) to stdout.  Exit 1 when a
case was not bit-identical, certify did not PASS, or a run failed."""

import argparse
import csv
import hashlib
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "contract"))

# name -> (n_layer, n_head, d_model, vocab, n_positions)
CONFIGS = {
    "1M": (4, 4, 128, 1024, 256),
    "10M": (6, 5, 320, 8192, 256),
    "40M": (10, 8, 512, 16384, 1024),
    "124M": (12, 12, 768, 50257, 1024),   # GPT-2 small
    "350M": (24, 16, 1024, 50257, 1024),  # GPT-2 medium
}
SEQ, MICRO_BATCH, DROPOUT, LR, WARMUP = 64, 2, 0.1, 3e-4, 2
# The current recorder's host memory (issue 43): (16K + 88) bytes per
# parameter beyond the plain run's.
LAW = "(16*K + 88) * P"
MEASURED = {}  # K -> (P, bytes the recorded run needed beyond the plain run's), --law auto
# --mistake: the pitfall certify must name (its diagnosis line).
MISTAKES = {"none": None, "unshifted": "token-count-unshifted-labels",
            "no_div": "no-loss-normalization"}
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def parameters(name):
    """The decoder's parameter count from its config (tied head)."""
    n_layer, _, d, vocab, ctx = CONFIGS[name]
    return n_layer * (12 * d * d + 13 * d) + vocab * d + ctx * d + 2 * d


def plain_estimate(P):
    """A plain run's peak before it is measured: torch's ~0.4 GB, and
    parameters, gradients and AdamW's two moments in float32."""
    return 0.4e9 + 16 * P


def law_bytes(law, P, K):
    """The recorder's predicted memory beyond the plain run's, and how it
    was predicted.  auto: the largest smaller model measured at this K,
    its extra bytes per parameter times P (a recorder whose memory grows
    slower than P is over-predicted: the safe side); none measured yet:
    the current recorder's law."""
    if law == "auto":
        P0, extra = max((m for k, m in MEASURED.items() if k == K and m[0] < P), default=(0, 0))
        if P0:
            return extra / P0 * P, "%.0f B/parameter measured at %d parameters" % (extra / P0, P0)
        law = LAW
    return float(eval(law, {"__builtins__": {}}, {"P": P, "K": K})), law


# ---- the child: one run


def child(size, K, steps, record, trace, autocast, mistake="none"):
    import contextlib

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    import models  # knows no accumcheck: a plain run imports none

    torch.set_num_threads(1)

    class Attention(nn.Module):
        def __init__(self, d, heads, p):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.heads, self.p, self.drop = heads, p, nn.Dropout(p)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                       for t in self.c_attn(x).split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                               is_causal=True)
            return self.drop(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))

    class Block(nn.Module):
        def __init__(self, d, heads, p):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = Attention(d, heads, p)
            self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.drop = nn.Dropout(p)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))

    class GPT2(nn.Module):
        """GPT-2's decoder: token and position embeddings, pre-LayerNorm
        blocks of causal self-attention and a GELU MLP, a final LayerNorm,
        the head tied to the token embedding; GPT-2's initialization."""

        def __init__(self, n_layer, n_head, d, vocab, ctx, p):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.drop = nn.Dropout(p)
            self.h = nn.ModuleList(Block(d, n_head, p) for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight
            for name, t in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(t)
                elif t.dim() > 1:
                    std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(t, 0.0, std)

        def forward(self, idx):
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
            for b in self.h:
                x = b(x)
            return self.lm_head(self.ln_f(x))

    def data(n, vocab, g):
        """n sequences of 8..SEQ tokens, the labels of a random prompt
        prefix IGNORE (only the completion is trained on)."""
        out = []
        for _ in range(n):
            L = int(torch.randint(8, SEQ + 1, (1,), generator=g))
            seq = torch.randint(1, vocab, (L + 1,), generator=g)
            y = seq[1:].clone()
            y[:int(torch.randint(1, L // 2 + 1, (1,), generator=g))] = models.IGNORE
            out.append((seq[:L], y))
        return out

    def pad(batch):
        """DataCollatorForSeq2Seq: padded to the batch's longest."""
        T = max(len(x) for x, _ in batch)
        x = torch.full((len(batch), T), models.PAD, dtype=torch.long)
        y = torch.full((len(batch), T), models.IGNORE, dtype=torch.long)
        for i, (xi, yi) in enumerate(batch):
            x[i, :len(xi)], y[i, :len(yi)] = xi, yi
        return x, y

    torch.manual_seed(0)
    n_layer, n_head, d, vocab, ctx = CONFIGS[size]
    model = GPT2(n_layer, n_head, d, vocab, ctx, DROPOUT).train()
    total = 1 + steps
    loader = DataLoader(data(total * K * MICRO_BATCH, vocab, torch.Generator().manual_seed(1)),
                        batch_size=MICRO_BATCH, shuffle=True, collate_fn=pad,
                        generator=torch.Generator().manual_seed(2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, models.warmup_linear(WARMUP, 100))
    items = models.gpt_items

    def summed_loss(model, batch):
        # Transformers' autocast_smart_context_manager: the forward and the
        # loss under autocast, the backward outside it.
        with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast == "bf16"
              else contextlib.nullcontext()):
            return models.gpt_summed_loss(model, batch)
    rec = None
    c_setup = time.process_time()
    if record:
        from accumcheck_torch import ContractRecorder
        rec = ContractRecorder(model, optimizer, summed_loss, items, accumulation=K,
                               out=trace, items="tokens",
                               lr=LR, schedule={"kind": "linear", "warmup": WARMUP, "total": 100},
                               clip=1.0)
        loader = rec.watch(loader)
    c_setup = time.process_time() - c_setup
    c0 = c1 = None
    for s, window in enumerate(models.windows(loader, K)):  # Transformers' _inner_training_loop
        if s == 1:
            c0 = time.process_time()
        num_items_in_batch = sum(items(b) for b in window)
        if mistake == "unshifted":
            # Each sequence's position 0 counted too, as a count over
            # unshifted labels does (token-count-unshifted-labels).
            num_items_in_batch += sum(b[1].shape[0] for b in window)
        for b in window:
            loss = summed_loss(model, b)
            # no_div: each micro-batch's mean over its own tokens, the
            # window's sum never divided (no-loss-normalization).
            (loss / items(b) if mistake == "no_div" else loss / num_items_in_batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print("  step %d/%d: %.1f s CPU so far" % (s + 1, total, time.process_time()), file=sys.stderr,
              flush=True)
    c1 = time.process_time()
    if rec is not None:
        rec.close()
    c2 = time.process_time()
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy())  # no copy: the buffer itself
    print(json.dumps({"P": sum(p.numel() for p in model.parameters()), "steps": s,
                      "setup_cpu": c_setup, "steps_cpu": c1 - c0, "close_cpu": c2 - c1,
                      "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "hash": h.hexdigest()}))


# ---- the parent


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def run_one(a, size, K, record, trace):
    argv = [sys.executable, os.path.abspath(__file__), "--child", size, str(K), str(a.steps),
            "1" if record else "0", trace, a.autocast, a.mistake]
    env = dict(os.environ, **THREADS)
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)  # its stderr: ours
    if p.returncode != 0:
        return None, "exit %d (its stderr above)" % p.returncode
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall"] = time.perf_counter() - t0
    return r, None


def case(a, size, K, tool, budget):
    """One (size, K): the row of the table."""
    P = parameters(size)
    row = {"size": size, "P": P, "K": K, "steps": a.steps, "autocast": a.autocast,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": "%.2f" % os.getloadavg()[0]}
    if plain_estimate(P) > budget:
        row["skipped"] = "the plain run's estimate %.1f GB exceeds --budget-gb %.1f" % (
            plain_estimate(P) / 1e9, budget / 1e9)
        say("%s K=%d: skipped: %s" % (size, K, row["skipped"]))
        return row
    work = tempfile.mkdtemp(prefix="recorder_scale-")
    trace = os.path.join(work, "trace")
    plain, recorded, fail = [], [], None
    for rep in range(a.repeats):
        for record in (False, True):
            if record and rep == 0:
                extra, how = law_bytes(a.law, P, K)
                need = min(x["maxrss"] for x in plain) + extra
                row["predicted_rec_MB"] = round(need / 1e6)
                if need > budget:
                    row["skipped"] = ("recorded: predicted %.1f GB (plain %.1f GB + %s) exceeds "
                                      "--budget-gb %.1f" % (need / 1e9, plain[0]["maxrss"] / 1e9,
                                                            how, budget / 1e9))
                    say("%s K=%d: recorded run skipped: %s" % (size, K, row["skipped"]))
                    break
            say("%s K=%d %s run %d/%d ..." % (size, K, "recorded" if record else "plain",
                                               rep + 1, a.repeats))
            r, fail = run_one(a, size, K, record, trace)
            if fail:
                say("  failed: " + fail)
                row["failed"] = "%s: %s" % ("recorded" if record else "plain", fail)
                break
            say("  %.1f s wall, %.3f s CPU a step, %.0f MB peak" % (
                r["wall"], (r["steps_cpu"] + r["close_cpu"]) / a.steps, r["maxrss"] / 1e6))
            (recorded if record else plain).append(r)
        if fail or "skipped" in row:
            break
    if plain:
        row["plain_cpu"] = min(x["steps_cpu"] / a.steps for x in plain)
        row["plain_MB"] = min(x["maxrss"] for x in plain) / 1e6
    if recorded:
        per = [(x["steps_cpu"] + x["close_cpu"]) / a.steps for x in recorded]
        row["rec_cpu"] = min(per)
        row["rec_close_cpu"] = min(x["close_cpu"] for x in recorded)
        row["rec_setup_cpu"] = min(x["setup_cpu"] for x in recorded)
        row["rec_MB"] = min(x["maxrss"] for x in recorded) / 1e6
        row["cpu_x"] = row["rec_cpu"] / row["plain_cpu"]
        row["mem_x"] = row["rec_MB"] / row["plain_MB"]
        MEASURED[K] = (P, max(0.0, (row["rec_MB"] - row["plain_MB"]) * 1e6))
        hashes = {x["hash"] for x in plain + recorded}
        row["identical"] = "yes" if len(hashes) == 1 else "NO (%d distinct)" % len(hashes)
        say("%s K=%d: trained parameters %s with and without the recorder" % (
            size, K, "bit-identical" if len(hashes) == 1 else "DIFFER"))
        say("%s K=%d: accumcheck certify --contract ..." % (size, K))
        sys.path.insert(0, HERE)
        import contract_bench  # its certify(): accumcheck_torch imported here, in the parent only
        c, cpu, _ = contract_bench.certify(tool, trace)
        verdict = [ln for ln in c.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
        named = [ln for ln in c.stdout.splitlines() if ln.startswith("diagnosis: matches ")]
        if named:
            row["named"] = named[0].split()[2]
        # A bf16 trace's precision check: the candidate nearest correct and
        # how far (in its uncertainty: above 1 is told apart).
        near = re.search(r"nearest other candidate, (\S+), at ([0-9.eE+-]+) of the uncertainty",
                         c.stdout)
        if near:
            row["nearest"] = "%s %s" % (near.group(1).rstrip(","), near.group(2))
        # A refusal reads "accumcheck: FILE: KEY: why" (its whole line: the CSV's certify_message).
        said = (c.stderr.strip().splitlines() or ["?"])[-1].split(": ")
        row["certify"] = "exit %d %s" % (c.returncode, verdict[-1].split(":")[0] if verdict else
                                         "refused (%s)" % said[2] if len(said) > 3 else said[-1][:80])
        row["certify_cpu"] = cpu
        if c.returncode != 0:
            row["certify_message"] = (c.stderr.strip().splitlines() or ["?"])[-1]  # the CSV's
        # The PASS/FAIL line's "max X of the uncertainty": how near the
        # worst step's weights came to the bound (1 = at it).
        margin = re.search(r"max ([0-9.eE+-]+) of the uncertainty", verdict[-1] if verdict else "")
        if margin:
            row["margin"] = float(margin.group(1))
        say("  %s, %.3f s CPU" % (row["certify"], cpu))
    if os.path.isdir(trace) and not (row.get("certify", "").startswith("exit 0 PASS") and
                                     row["identical"] == "yes"):
        say("%s K=%d: the last trace kept: %s" % (size, K, trace))
    else:
        shutil.rmtree(work)
    return row


COLUMNS = [("size", "size", "%s"), ("P", "parameters", "%d"), ("K", "K", "%d"),
           ("plain_cpu", "plain CPU/step (s)", "%.3f"), ("rec_cpu", "recorded CPU/step (s)", "%.3f"),
           ("cpu_x", "CPU x", "%.2f"), ("plain_MB", "plain peak (MB)", "%.0f"),
           ("rec_MB", "recorded peak (MB)", "%.0f"), ("mem_x", "memory x", "%.2f"),
           ("rec_close_cpu", "close() CPU (s)", "%.3f"), ("certify", "certify", "%s"),
           ("margin", "weights / uncertainty", "%.3g"), ("named", "named", "%s"),
           ("nearest", "nearest other candidate", "%s"), ("certify_cpu", "certify CPU (s)", "%.3f"),
           ("identical", "bit-identical", "%s"),
           ("load", "load avg", "%s")]


def cell(row, key, fmt):
    if key in row:
        return fmt % row[key]
    if key == "rec_cpu" and ("skipped" in row or "failed" in row):
        return row.get("skipped") or row["failed"]
    return "-"


def table(rows):
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + " --- |" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r, k, f) for k, _, f in COLUMNS) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=7,
                    metavar=("SIZE", "K", "STEPS", "RECORD", "TRACE", "AUTOCAST", "MISTAKE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build folder holding cli/accumcheck (default: build/)")
    ap.add_argument("--sizes", default="1M,10M,40M,124M,350M",
                    help="of " + ",".join("%s (%d)" % (k, parameters(k)) for k in CONFIGS))
    ap.add_argument("--ks", default="4,16,64")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps timed, after one warm-up step")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, the least reported")
    ap.add_argument("--budget-gb", type=float, default=None,
                    help="skip a run predicted to need more (default: 80%% of MemAvailable now)")
    ap.add_argument("--law", default="auto",
                    help="the recorder's memory beyond the plain run's, in bytes: a formula of P "
                         "(parameters) and K, e.g. the current recorder's (issue 43) '%s'; or "
                         "auto (default): per parameter as measured at the largest smaller size "
                         "with the same K, that formula before any" % LAW)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: each forward and loss under torch.autocast('cpu', torch.bfloat16)")
    ap.add_argument("--mistake", choices=sorted(MISTAKES), default="none",
                    help="run a mistaken loop, plain and recorded: unshifted (each sequence's "
                         "position 0 counted in the window's tokens), no_div (each micro-batch's "
                         "mean token loss, the window's sum never divided); certify must FAIL "
                         "naming its pitfall")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each case's parameters and predicted memory, run nothing")
    ap.add_argument("--out", help="also write the rows: FILE.csv (all columns) or FILE.md (the table)")
    a = ap.parse_args()
    if a.child:
        size, K, steps, record, trace, autocast, mistake = a.child
        return child(size, int(K), int(steps), record == "1", trace, autocast, mistake)
    sizes, ks = a.sizes.split(","), [int(k) for k in a.ks.split(",")]
    bad = [s for s in sizes if s not in CONFIGS]
    if bad or a.steps < 1 or a.repeats < 1 or min(ks) < 1:
        ap.error("--sizes takes %s (got %s); --steps, --repeats and --ks are >= 1"
                 % (",".join(CONFIGS), a.sizes))
    tool = os.path.join(a.build, "cli", "accumcheck")
    if not a.dry_run and not os.access(tool, os.X_OK):
        ap.error("--build %s: no %s (build it: bash scripts/build.sh)" % (a.build, tool))
    if a.budget_gb is None:
        with open("/proc/meminfo") as f:
            avail = [ln for ln in f if ln.startswith("MemAvailable:")][0]
        budget = 0.8 * int(avail.split()[1]) * 1024
    else:
        budget = a.budget_gb * 1e9
    if a.dry_run:
        for size in sizes:
            P = parameters(size)
            for K in ks:
                extra, how = law_bytes(a.law, P, K)
                need = plain_estimate(P) + extra
                print("%-5s %11d parameters K=%-3d plain ~%.1f GB, recorded ~%.1f GB (%s)%s" % (
                    size, P, K, plain_estimate(P) / 1e9, need / 1e9, how,
                    "" if need <= budget else ": over the budget %.1f GB" % (budget / 1e9)))
        return 0
    say("recorder_scale: budget %.1f GB, load average %s" % (
        budget / 1e9, " ".join("%.2f" % x for x in os.getloadavg())))
    rows = []
    for size in sizes:
        for K in ks:
            rows.append(case(a, size, K, tool, budget))
    md = table(rows)
    print(md)
    print("\n%s; load average at the end: %s; %d step(s) timed after 1 warm-up, least of %d, one "
          "thread%s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                        " ".join("%.2f" % x for x in os.getloadavg()), a.steps, a.repeats,
                        ("; bf16 autocast" if a.autocast == "bf16" else "")
                        + ("" if a.mistake == "none" else "; mistake: " + a.mistake)))
    if a.out:
        with open(a.out, "w", newline="") as f:
            if a.out.endswith(".md"):
                f.write(md + "\n")
            else:
                keys = sorted({k for r in rows for k in r})
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
    want = MISTAKES[a.mistake]
    ok = all(r.get("identical", "yes") == "yes" and "failed" not in r and
             (r.get("certify", "exit 0 PASS").startswith("exit 0 PASS") if want is None else
              r.get("certify", "").startswith("exit 1 FAIL") and r.get("named") == want)
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
