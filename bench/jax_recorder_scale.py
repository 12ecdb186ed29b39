"""What accumcheck_jax's ContractRecorder costs a JAX language-model run
of the size people accumulate gradients for (issue 46), as
bench/recorder_scale.py measures accumcheck_torch's: a GPT-2-style
decoder in plain JAX (built from a config here, no download: GPT-2's
pre-LayerNorm blocks, causal attention, GELU, learned positions, the head
tied to the token embedding; no dropout) of about 1M, 10M, 40M or 124M
parameters (bench/recorder_scale.py's configurations), trained by a hand
accumulation loop written as JAX users write one: `jax.grad` of the summed
token loss jitted, the window's gradients summed by a jitted add and
divided by the window's tokens in a jitted step, `optax.chain(
clip_by_global_norm(1.0), inject_hyperparams(adamw))` with a linear
warmup and decay; synthetic sequences of 8 to 64 tokens, the labels of a
random prompt prefix ignored (-100), micro-batches of 2 padded to 64 (one
shape: no recompilation).

Each run is a fresh process pinned to one CPU (its affinity set before jax
is imported: all its threads share that CPU), so its peak RSS is its own;
a plain run imports no accumcheck.  A run takes one optimizer step
untimed (the compilations, the recorder's included), then `--steps`
steps timed in CPU time (a recorded run's includes `rec.close()`); plain
and recorded alternate, the least of `--repeats` of each is reported.
Then `accumcheck certify --contract` judges the last recorded trace, and
the digest of the trained parameters of every run, plain and recorded,
must be one and the same (exit 1 otherwise, when certify does not PASS
the correct loop or FAIL the mistaken one naming its pitfall, or when a
ratio exceeds --budget).  The whole run's CPU time (compilation
included) is reported beside it.

    .venv-jax/bin/python bench/jax_recorder_scale.py [--build build] [--sizes 1M,10M,40M]
        [--ks 4,16] [--steps 2] [--repeats 2] [--cpu 1] [--mistake no_div|mean_of_means]
        [--python DIR] [--profile FILE] [--out FILE.md]

The current numbers: docs/frameworks-jax-keras.md, "What recording costs".
"""

import argparse
import hashlib
import json
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

# name -> (n_layer, n_head, d_model, vocab, n_positions): recorder_scale.py's.
CONFIGS = {
    "1M": (4, 4, 128, 1024, 256),
    "10M": (6, 5, 320, 8192, 256),
    "40M": (10, 8, 512, 16384, 1024),
    "124M": (12, 12, 768, 50257, 1024),
}
SEQ, MICRO_BATCH, LR, WARMUP, TOTAL, IGNORE, PAD = 64, 2, 3e-4, 2, 100, -100, 0
# --mistake: the loop's mistake and the pitfall certify must name.
MISTAKES = {"none": None, "no_div": "no-loss-normalization", "mean_of_means": "token-mean-of-means"}


def parameters(name):
    """The decoder's parameter count (tied head)."""
    n_layer, _, d, vocab, ctx = CONFIGS[name]
    return n_layer * (12 * d * d + 13 * d) + vocab * d + ctx * d + 2 * d


# ---- the child: one run


def decoder(size):
    """(params, forward): the decoder's parameters (seeded) and its forward
    forward(params, tokens) -> logits."""
    import numpy as np
    import jax
    import jax.numpy as jnp

    n_layer, n_head, d, vocab, ctx = CONFIGS[size]
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4 + 4 * n_layer))

    def normal(shape, std):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    def block():
        proj = 0.02 / np.sqrt(2 * n_layer)
        return {"ln1": {"g": jnp.ones(d), "b": jnp.zeros(d)},
                "attn": {"w": normal((d, 3 * d), 0.02), "b": jnp.zeros(3 * d),
                         "proj_w": normal((d, d), proj), "proj_b": jnp.zeros(d)},
                "ln2": {"g": jnp.ones(d), "b": jnp.zeros(d)},
                "mlp": {"w": normal((d, 4 * d), 0.02), "b": jnp.zeros(4 * d),
                        "proj_w": normal((4 * d, d), proj), "proj_b": jnp.zeros(d)}}

    params = {"wte": normal((vocab, d), 0.02), "wpe": normal((ctx, d), 0.01),
              "h": [block() for _ in range(n_layer)],
              "ln_f": {"g": jnp.ones(d), "b": jnp.zeros(d)}}

    def layer_norm(p, x):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]

    def attention(p, x):
        B, T, _ = x.shape
        q, k, v = jnp.split(x @ p["w"] + p["b"], 3, axis=-1)

        def heads(t):
            return t.reshape(B, T, n_head, d // n_head).transpose(0, 2, 1, 3)
        q, k, v = heads(q), heads(k), heads(v)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // n_head)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, jnp.finfo(s.dtype).min)
        y = jax.nn.softmax(s, axis=-1) @ v
        return y.transpose(0, 2, 1, 3).reshape(B, T, d) @ p["proj_w"] + p["proj_b"]

    def forward(params, idx):
        x = params["wte"][idx] + params["wpe"][:idx.shape[1]]
        for b in params["h"]:
            x = x + attention(b["attn"], layer_norm(b["ln1"], x))
            h = jax.nn.gelu(layer_norm(b["ln2"], x) @ b["mlp"]["w"] + b["mlp"]["b"])
            x = x + h @ b["mlp"]["proj_w"] + b["mlp"]["proj_b"]
        return layer_norm(params["ln_f"], x) @ params["wte"].T

    return params, forward


def child(size, K, steps, record, trace, mistake="none"):
    import numpy as np
    import jax
    import jax.numpy as jnp
    import optax

    vocab = CONFIGS[size][3]
    params, forward = decoder(size)
    box = {"forward": forward}

    def summed_loss(params, batch):
        """The SUM of the micro-batch's token losses, the ignored labels left out."""
        x, y = batch
        logp = jax.nn.log_softmax(box["forward"](params, x))
        keep = y != IGNORE
        picked = jnp.take_along_axis(logp, jnp.where(keep, y, 0)[..., None], axis=-1)[..., 0]
        return -jnp.sum(jnp.where(keep, picked, 0.0))

    def tokens(batch):
        return int(np.sum(np.asarray(batch[1]) != IGNORE))

    # Sequences of 8..SEQ tokens, a random prompt prefix's labels ignored;
    # micro-batches of MICRO_BATCH padded to SEQ; the windows drawn first.
    rng = np.random.default_rng(1)
    n = (1 + steps) * K * MICRO_BATCH
    xs = np.full((n, SEQ), PAD, np.int32)
    ys = np.full((n, SEQ), IGNORE, np.int32)
    for i in range(n):
        L = int(rng.integers(8, SEQ + 1))
        seq = rng.integers(1, vocab, L + 1)
        xs[i, :L], ys[i, :L] = seq[:L], seq[1:]
        ys[i, :int(rng.integers(1, L // 2 + 1))] = IGNORE
    order = np.random.default_rng(2).permutation(n)
    batches = [(xs[order[i:i + MICRO_BATCH]], ys[order[i:i + MICRO_BATCH]])
               for i in range(0, n, MICRO_BATCH)]

    schedule = optax.join_schedules([optax.linear_schedule(0.0, LR, WARMUP),
                                     optax.linear_schedule(LR, 0.0, TOTAL - WARMUP)], [WARMUP])
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.inject_hyperparams(optax.adamw)(learning_rate=schedule,
                                                           weight_decay=0.01))
    profile = None
    if os.environ.get("JAX_RECORDER_SCALE_PROFILE"):  # --profile: the timed steps' cProfile
        import cProfile
        profile = cProfile.Profile(time.thread_time)
    rec = None
    c_setup = time.process_time()
    if record:
        sys.path.insert(0, os.environ.get("JAX_RECORDER_SCALE_PYTHON", os.path.join(ROOT, "python")))
        from accumcheck_jax import ContractRecorder
        rec = ContractRecorder(summed_loss, tokens, accumulation=K, out=trace, items="tokens",
                               lr=LR, schedule={"kind": "linear", "warmup": WARMUP,
                                                "total": TOTAL}, quiet=True)
        box["forward"] = rec.apply(forward)
        tx = rec.optimizer(tx)
    c_setup = time.process_time() - c_setup
    def mean_loss(params, batch):
        """--mistake no_div and mean_of_means: each micro-batch's loss the
        mean over its own tokens (the window's sum never divided, or
        divided by K)."""
        return summed_loss(params, batch) / jnp.maximum(jnp.sum(batch[1] != IGNORE), 1)

    grad_fn = jax.jit(jax.grad(summed_loss if mistake == "none" else mean_loss))
    if rec:
        grad_fn = rec.grad(grad_fn)
    add = jax.jit(lambda a, g: jax.tree_util.tree_map(jnp.add, a, g))

    @jax.jit
    def apply(params, state, acc, scale):
        grads = jax.tree_util.tree_map(lambda a: a * scale, acc)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    c_start = time.process_time()
    drawn = rec.watch(batches) if rec else batches
    c0 = None
    window, s = [], 0
    for batch in drawn:
        window.append(batch)
        if len(window) < K:
            continue
        if s == 1:
            jax.block_until_ready(params)
            c0 = time.process_time()
            if profile:
                profile.enable()
        n_tokens = sum(tokens(b) for b in window)
        acc = None
        for b in window:
            g = grad_fn(params, (jnp.asarray(b[0]), jnp.asarray(b[1])))
            acc = g if acc is None else add(acc, g)
        scale = {"none": 1.0 / n_tokens, "no_div": 1.0, "mean_of_means": 1.0 / K}[mistake]
        params, state = apply(params, state, acc, jnp.float32(scale))
        window, s = [], s + 1
        print("  step %d/%d: %.1f s CPU so far" % (s, 1 + steps, time.process_time()),
              file=sys.stderr, flush=True)
    jax.block_until_ready(params)
    c1 = time.process_time()
    if rec is not None:
        rec.close(params)
    c2 = time.process_time()
    if profile:
        profile.disable()
        profile.dump_stats(os.environ["JAX_RECORDER_SCALE_PROFILE"] + (".rec" if record else ".plain"))
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    print(json.dumps({"P": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
                      "setup_cpu": c_setup, "steps_cpu": c1 - c0, "close_cpu": c2 - c1,
                      "whole_cpu": c2 - c_start,
                      "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "hash": h.hexdigest()}))


# ---- the parent


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def run_one(a, size, K, record, trace):
    argv = [sys.executable, os.path.abspath(__file__), "--cpu", str(a.cpu), "--child", size,
            str(K), str(a.steps), "1" if record else "0", trace, a.mistake]
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, text=True)  # its stderr: ours
    if p.returncode != 0:
        return None, "exit %d (its stderr above)" % p.returncode
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall"] = time.perf_counter() - t0
    return r, None


def certify(tool, trace):
    """`accumcheck certify --contract` on the trace: (the process, its CPU s)."""
    u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    c = subprocess.run([tool, "certify", "--contract", "--trace", trace], capture_output=True,
                       text=True)
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c, (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)


def case(a, size, K, tool):
    """One (size, K): the row of the table."""
    row = {"size": size, "P": parameters(size), "K": K, "load": "%.2f" % os.getloadavg()[0]}
    work = tempfile.mkdtemp(prefix="jax_recorder_scale-")
    trace = os.path.join(work, "trace")
    runs = {False: [], True: []}
    for rep in range(a.repeats):
        for record in (False, True):
            say("%s K=%d %s run %d/%d ..." % (size, K, "recorded" if record else "plain",
                                               rep + 1, a.repeats))
            r, fail = run_one(a, size, K, record, trace)
            if fail:
                row["failed"] = "%s: %s" % ("recorded" if record else "plain", fail)
                say("  failed: " + fail)
                shutil.rmtree(work)
                return row
            say("  %.1f s wall, %.3f s CPU a step, %.3f s CPU whole, %.0f MB peak" % (
                r["wall"], (r["steps_cpu"] + r["close_cpu"]) / a.steps, r["whole_cpu"],
                r["maxrss"] / 1e6))
            runs[record].append(r)
    plain, recorded = runs[False], runs[True]
    row["plain_cpu"] = min(x["steps_cpu"] / a.steps for x in plain)
    row["rec_cpu"] = min((x["steps_cpu"] + x["close_cpu"]) / a.steps for x in recorded)
    row["cpu_x"] = row["rec_cpu"] / row["plain_cpu"]
    row["plain_whole"] = min(x["whole_cpu"] for x in plain)
    row["rec_whole"] = min(x["whole_cpu"] for x in recorded)
    row["whole_x"] = row["rec_whole"] / row["plain_whole"]
    row["rec_close_cpu"] = min(x["close_cpu"] for x in recorded)
    row["plain_MB"] = min(x["maxrss"] for x in plain) / 1e6
    row["rec_MB"] = min(x["maxrss"] for x in recorded) / 1e6
    row["mem_x"] = row["rec_MB"] / row["plain_MB"]
    hashes = {x["hash"] for x in plain + recorded}
    row["identical"] = "yes" if len(hashes) == 1 else "NO (%d distinct)" % len(hashes)
    c, cpu = certify(tool, trace)
    verdict = [ln for ln in c.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    row["certify"] = "exit %d %s" % (c.returncode, verdict[-1].split(":")[0] if verdict else
                                     (c.stderr.strip().splitlines() or ["?"])[-1][:100])
    named = [ln.split()[2] for ln in c.stdout.splitlines() if ln.startswith("diagnosis: matches ")]
    if named:
        row["named"] = named[0]
    margin = re.search(r"max ([0-9.eE+-]+) of the uncertainty", verdict[-1] if verdict else "")
    if margin:
        row["margin"] = float(margin.group(1))
    row["certify_cpu"] = cpu
    say("%s K=%d: %s; trained parameters %s" % (size, K, row["certify"], row["identical"]))
    if not judged_right(row, a.mistake) or row["identical"] != "yes":
        say("%s K=%d: the last trace kept: %s" % (size, K, trace))
    else:
        shutil.rmtree(work)
    return row


COLUMNS = [("size", "size", "%s"), ("P", "parameters", "{:,}"), ("K", "K", "%d"),
           ("plain_cpu", "plain CPU/step (s)", "%.3f"), ("rec_cpu", "recorded CPU/step (s)", "%.3f"),
           ("cpu_x", "CPU x", "%.2fx"), ("plain_whole", "plain whole run (s)", "%.2f"),
           ("rec_whole", "recorded whole run (s)", "%.2f"), ("whole_x", "whole x", "%.2fx"),
           ("plain_MB", "plain peak (MB)", "%.0f"), ("rec_MB", "recorded peak (MB)", "%.0f"),
           ("mem_x", "memory x", "%.2fx"), ("rec_close_cpu", "close() CPU (s)", "%.3f"),
           ("certify", "certify", "%s"), ("margin", "weights / uncertainty", "%.3g"),
           ("named", "named", "%s"),
           ("identical", "bit-identical", "%s"), ("load", "load avg", "%s")]


def judged_right(row, mistake):
    """certify PASSed the correct loop, or FAILed the mistaken one naming
    its pitfall."""
    if MISTAKES[mistake] is None:
        return row.get("certify", "").startswith("exit 0 PASS")
    return row.get("certify", "").startswith("exit 1 FAIL") and row.get("named") == MISTAKES[mistake]


def table(rows):
    def cell(row, key, fmt):
        if key not in row:
            return row.get("failed", "-") if key == "rec_cpu" else "-"
        return fmt.format(row[key]) if "{" in fmt else fmt % row[key]
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r, k, f) for k, _, f in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=6, metavar=("SIZE", "K", "STEPS", "RECORD", "TRACE", "MISTAKE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build directory holding cli/accumcheck (default: build)")
    ap.add_argument("--sizes", default="1M,10M,40M", help="of " + ",".join(CONFIGS))
    ap.add_argument("--ks", default="4,16")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps timed, after one untimed")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each, the least reported")
    ap.add_argument("--cpu", type=int, default=1, help="the CPU each run is pinned to")
    ap.add_argument("--mistake", choices=sorted(MISTAKES), default="none",
                    help="run that mistaken loop, plain and recorded (each micro-batch's loss the "
                         "mean over its tokens, the window's sum never divided: certify must FAIL "
                         "naming no-loss-normalization; or divided by K: token-mean-of-means)")
    ap.add_argument("--budget", type=float, default=1.5,
                    help="exit 1 when a row's CPU a step exceeds this ratio (default 1.5)")
    ap.add_argument("--out", help="also write the table to FILE (markdown)")
    ap.add_argument("--python", metavar="DIR",
                    help="the recorder measured: accumcheck_jax imported from DIR (e.g. an older "
                         "commit's python/ from `git archive`), to compare two recorders")
    ap.add_argument("--profile", metavar="FILE",
                    help="cProfile the last run's timed steps and close() on the main thread's CPU "
                         "time: FILE.plain, FILE.rec")
    a = ap.parse_args()
    if a.child:
        os.sched_setaffinity(0, {a.cpu})  # before jax: every thread it starts on that CPU
        size, K, steps, record, trace, mistake = a.child
        child(size, int(K), int(steps), record == "1", trace, mistake)
        return 0
    bad = [s for s in a.sizes.split(",") if s not in CONFIGS]
    if bad or a.steps < 1 or a.repeats < 1:
        ap.error("--sizes: of %s; --steps and --repeats at least 1" % ",".join(CONFIGS))
    if not all(k.isdigit() and int(k) >= 1 for k in a.ks.split(",")):
        ap.error("--ks: accumulation steps, integers >= 1 separated by commas (e.g. 4,16), got %r"
                 % a.ks)
    if a.cpu not in os.sched_getaffinity(0):
        ap.error("--cpu %d: not a CPU this process may run on (%s)"
                 % (a.cpu, ",".join(map(str, sorted(os.sched_getaffinity(0))))))
    if a.python:
        os.environ["JAX_RECORDER_SCALE_PYTHON"] = os.path.abspath(a.python)
    if a.profile:
        os.environ["JAX_RECORDER_SCALE_PROFILE"] = os.path.abspath(a.profile)
    tool = os.path.join(a.build, "cli", "accumcheck")
    if not os.access(tool, os.X_OK):
        ap.error("no %s: build the project first (cmake --build build)" % tool)
    rows = [case(a, s, int(k), tool) for s in a.sizes.split(",") for k in a.ks.split(",")]
    text = table(rows)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    bad = [r for r in rows if "failed" in r or r.get("identical") != "yes"
           or not judged_right(r, a.mistake) or r["cpu_x"] > a.budget]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
