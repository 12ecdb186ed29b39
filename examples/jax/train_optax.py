"""Gradient accumulation in JAX with optax, recorded by accumcheck_jax's
ContractRecorder and judged by `accumcheck certify --contract`.

    python examples/jax/train_optax.py --loop hand --out trace/
    accumcheck certify --contract --trace trace/

A small MLP classifier on seeded synthetic data; micro-batches of 4 (or
of the sizes --sizes cycles through); the loops (--loop):
  hand            correct: the summed loss's gradients summed over the
                  window, divided by the window's items (the short last
                  window too)
  mean_over_k     the mean loss's gradients summed, divided by K (the short
                  last window too: partial-cycle-scale-by-k)
  no_div_k        the mean loss's gradients summed, never divided
  double_div_k    the mean loss divided by K, and the sum divided by K again
  drop_partial    the short last window never stepped
  multisteps      optax.MultiSteps(inner, K) on the mean loss's gradients
                  (the mean of micro-batch means: correct only with equal
                  micro-batches)
  schedule_micro  hand, but the lr schedule's horizon counted in micro-batches
  nnx             Flax NNX: nnx.Optimizer over the model, hand accumulation
                  (the lr schedule as the others': --schedule, --warmup)
  tokens          token-level items: sequences of uneven lengths (--seq
                  positions, the padding's labels -100, ignored), the
                  summed token loss's gradients summed over the window,
                  divided by the window's tokens (recorded items="tokens")
  tokens_mean     the same sequences, each micro-batch's loss the mean
                  over its own tokens, the window's sum divided by K: a
                  mean of micro-batch means (token-mean-of-means)
--warmup W starts the schedule with W steps of linear warmup from lr 0 (the
first step's update is zero); --schedule cosine decays by optax's cosine
instead of linearly. --no-record runs the same loop without the recorder (the bit-identity test
and the bench compare the two); --wrap-inside jits the recorder's wrapper
with the gradient function (recorded by a callback in the program);
--no-apply records without rec.apply (the forward not wrapped: g_j a
second gradient of the recorder's, not read from your backward).
--identity PATH runs the loop without the recorder first, then as asked,
in this process, and writes both runs' digests of the trained parameters
to PATH.rank0 ("plain SHA", "recorded SHA": they must be equal, the
recorder never changes the run; tests/pytorch/ctest_contract.py
--identity compares them).
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import jax
import jax.numpy as jnp
import optax
from accumcheck_jax import ContractRecorder, Refused, exit_on_refusal

import _digest

LOOPS = ("hand", "mean_over_k", "no_div_k", "double_div_k", "drop_partial", "multisteps",
         "schedule_micro", "nnx", "tokens", "tokens_mean")
IGNORE = -100  # a label that carries no loss (padding), as -100 in PyTorch's losses


def data(samples, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    w = rng.standard_normal((features, classes)).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.standard_normal((samples, classes)), axis=1).astype(np.int32)
    return x, y


def token_data(samples, seq, features, classes, seed=0):
    """Sequences of `seq` positions, sample i holding 1 + (a seeded draw
    below seq) tokens: the labels past its length are IGNORE (padding)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, seq, features)).astype(np.float32)
    w = rng.standard_normal((features, classes)).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.standard_normal((samples, seq, classes)), axis=2)
    lengths = rng.integers(1, seq + 1, size=samples)
    y[np.arange(seq)[None, :] >= lengths[:, None]] = IGNORE
    return x, y.astype(np.int32)


def micro_batches(x, y, sizes):
    out, at, i = [], 0, 0
    while at < len(x):
        n = sizes[i % len(sizes)]
        out.append((x[at:at + n], y[at:at + n]))
        at, i = at + n, i + 1
    return out


def init_params(features, hidden, classes, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w1": jax.random.normal(k1, (features, hidden)) / np.sqrt(features),
            "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, classes)) / np.sqrt(hidden),
            "b2": jnp.zeros(classes)}


def logits_of(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def losses(forward):
    """The summed and the mean loss, and the summed and the mean token loss,
    of the model's forward `forward` (the recorder's rec.apply(logits_of),
    or logits_of itself)."""
    def summed_loss(params, batch):
        x, y = batch
        logp = jax.nn.log_softmax(forward(params, x))
        return -jnp.sum(jnp.take_along_axis(logp, y[:, None], axis=1))

    def mean_loss(params, batch):
        return summed_loss(params, batch) / batch[0].shape[0]

    def summed_token_loss(params, batch):
        """The SUM of the batch's token losses, the IGNORE labels left out."""
        x, y = batch
        logp = jax.nn.log_softmax(forward(params, x))
        keep = y != IGNORE
        nll = -jnp.take_along_axis(logp, jnp.where(keep, y, 0)[..., None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(keep, nll, 0.0))

    def token_mean_loss(params, batch):
        """The mean over the micro-batch's own tokens."""
        return summed_token_loss(params, batch) / jnp.maximum(jnp.sum(batch[1] != IGNORE), 1)
    return summed_loss, mean_loss, summed_token_loss, token_mean_loss


summed_loss, mean_loss, summed_token_loss, token_mean_loss = losses(logits_of)


def items(batch):
    return len(batch[1])


def tokens(batch):
    """The batch's loss-bearing tokens (labels not IGNORE)."""
    return int(np.sum(np.asarray(batch[1]) != IGNORE))


def linear(base, total, warmup=0):
    """certify's linear kind: base * n / W while n < W (so lr 0 at the first
    step), then base * max(0, (T - n) / max(1, T - W)) after n steps
    (sim/lr_schedule.hpp)."""
    def at(n):
        decay = base * jnp.maximum(0.0, (total - n) / max(1, total - warmup))
        return decay if warmup == 0 else jnp.where(n < warmup, base * n / warmup, decay)
    return at


def run(args, mark=None):
    """The loop args names, trained; mark (the cost bench's): called once,
    the first window's optimizer step done (its parameters ready): what
    came before is the run's start (its compilations), what follows its
    steady state."""
    token_level = args.loop in ("tokens", "tokens_mean")
    if token_level:
        x, y = token_data(args.samples, args.seq, args.features, 4)
    else:
        x, y = data(args.samples, args.features, 4)
    batches = micro_batches(x, y, [int(s) for s in args.sizes.split(",")])
    K, epochs = args.K, args.epochs
    windows = -(-len(batches) // K)
    total = windows * epochs
    # schedule_micro: the horizon sized in micro-batches, as
    # num_training_steps = len(loader) * epochs sizes it.
    horizon = len(batches) * epochs if args.loop == "schedule_micro" else total
    if args.schedule == "cosine":
        # optax's own, evaluated in float32 (its 1 + cos(pi t / T) cancels
        # near the end: certify allows for it, lr_channel_abs_float32).
        sched = optax.warmup_cosine_decay_schedule(0.0, args.lr, args.warmup, horizon) \
            if args.warmup else optax.cosine_decay_schedule(args.lr, horizon)
    else:
        sched = linear(args.lr, horizon, args.warmup)
    schedule = {"kind": args.schedule, "warmup": args.warmup, "total": total}
    if args.loop == "nnx":
        return run_nnx(args, batches, sched, schedule, mark)
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=sched)
    if args.loop == "multisteps":
        tx = optax.MultiSteps(tx, every_k_schedule=K)
    rec = None
    fns = (summed_loss, mean_loss, summed_token_loss, token_mean_loss)
    if args.record:
        # The forward wrapped (rec.apply): g_j read from your own backward
        # at the outputs, no second gradient (--no-apply: without it).
        forward = logits_of
        if args.apply:
            fns = losses(lambda p, x: forward(p, x))  # forward: read at each call
        rec = ContractRecorder(fns[2] if token_level else fns[0],
                               tokens if token_level else items, accumulation=K, out=args.out,
                               items="tokens" if token_level else "samples",
                               lr=args.lr, schedule=schedule, quiet=args.quiet)
        if args.apply:
            forward = rec.apply(logits_of)
        tx = rec.optimizer(tx)
    summed, mean, summed_tok, tok_mean = fns
    fn = jax.grad(summed if args.loop in ("hand", "schedule_micro") else mean)
    if token_level:
        fn = jax.grad(summed_tok if args.loop == "tokens" else tok_mean)
    if args.loop == "double_div_k":
        fn = jax.grad(lambda p, b: mean(p, b) / K)
    # Your jitted gradient function, wrapped as it is (a wrapper jitted with
    # it, jax.jit(rec.grad(fn)), records through a callback: the same
    # trace, dearer).
    if rec and args.wrap_inside:
        grad_fn = jax.jit(rec.grad(fn))
    else:
        grad_fn = rec.grad(jax.jit(fn)) if rec else jax.jit(fn)
    params = init_params(args.features, args.hidden, 4)
    state = tx.init(params)

    @jax.jit
    def apply(params, state, acc, scale):
        grads = jax.tree_util.tree_map(lambda a: a * scale, acc)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    @jax.jit
    def multistep(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    add = jax.jit(lambda a, g: jax.tree_util.tree_map(jnp.add, a, g))
    for epoch in range(epochs):
        drawn = rec.watch(batches) if rec else batches
        acc, n_items, in_window = None, 0, 0
        for i, batch in enumerate(drawn):
            batch = (jnp.asarray(batch[0]), jnp.asarray(batch[1]))
            g = grad_fn(params, batch)
            if args.loop == "multisteps":
                params, state = multistep(params, state, g)
                if mark and epoch == 0 and i == K - 1:
                    mark(params)
                continue
            acc = g if acc is None else add(acc, g)
            n_items += tokens(batch) if token_level else len(batch[1])
            in_window += 1
            last = i == len(batches) - 1
            if in_window == K or last:
                if last and in_window < K and args.loop == "drop_partial":
                    break
                if args.loop in ("hand", "schedule_micro", "tokens"):
                    scale = 1.0 / n_items
                elif args.loop == "no_div_k":
                    scale = 1.0
                else:
                    scale = 1.0 / K
                params, state = apply(params, state, acc, jnp.float32(scale))
                if mark and epoch == 0 and i + 1 == in_window:
                    mark(params)
                acc, n_items, in_window = None, 0, 0
    if rec:
        rec.close(params)
        if not args.quiet:
            print("trace written to %s" % args.out)
    return params


def run_nnx(args, batches, sched, schedule, mark=None):
    """The Flax NNX loop: nnx.grad, nnx.Optimizer, the lr schedule sched
    (declared to the recorder as schedule)."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(args.features, args.hidden, rngs=rngs)
            self.l2 = nnx.Linear(args.hidden, 4, rngs=rngs)

        def __call__(self, x):
            return self.l2(jnp.tanh(self.l1(x)))

    # The model's call, wrapped by rec.apply where recorded through it (g_j
    # read from your own backward at the outputs; --no-apply: without it).
    box = {"forward": lambda model, x: model(x)}

    def nnx_summed(model, batch):
        x, y = batch
        logp = jax.nn.log_softmax(box["forward"](model, x))
        return -jnp.sum(jnp.take_along_axis(logp, y[:, None], axis=1))

    K = args.K
    model = MLP(nnx.Rngs(0))
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=sched)
    rec = None
    if args.record:
        rec = ContractRecorder(nnx_summed, items, accumulation=K, out=args.out, lr=args.lr,
                               schedule=schedule, grad=nnx.grad, quiet=args.quiet)
        if args.apply:
            box["forward"] = rec.apply(box["forward"])
        tx = rec.optimizer(tx)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    fn = nnx.grad(nnx_summed)
    if rec and args.wrap_inside:
        grad_fn = nnx.jit(rec.grad(fn))
    else:
        grad_fn = rec.grad(nnx.jit(fn)) if rec else nnx.jit(fn)

    @nnx.jit
    def apply(model, optimizer, acc, scale):
        optimizer.update(model, jax.tree_util.tree_map(lambda a: a * scale, acc))

    for epoch in range(args.epochs):
        drawn = rec.watch(batches) if rec else batches
        acc, n_items, in_window = None, 0, 0
        for i, batch in enumerate(drawn):
            batch = (jnp.asarray(batch[0]), jnp.asarray(batch[1]))
            g = grad_fn(model, batch)
            acc = g if acc is None else jax.tree_util.tree_map(jnp.add, acc, g)
            n_items += len(batch[1])
            in_window += 1
            if in_window == K or i == len(batches) - 1:
                apply(model, optimizer, acc, jnp.float32(1.0 / n_items))
                if mark and epoch == 0 and i + 1 == in_window:
                    mark(nnx.state(model, nnx.Param))
                acc, n_items, in_window = None, 0, 0
    params = nnx.state(model, nnx.Param)
    if rec:
        rec.close(model)
    return params


def digest(params):
    """SHA-256 of the trained parameters (_digest.py), the tree's leaves in
    order."""
    return _digest.digest(jax.tree_util.tree_leaves(params))


def main(argv=None, mark=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loop", default="hand", help="one of: " + ", ".join(LOOPS))
    p.add_argument("--K", type=int, default=4)
    p.add_argument("--samples", type=int, default=44)
    p.add_argument("--sizes", default="4", help="micro-batch sizes, cycled (e.g. 2,6)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--schedule", choices=("linear", "cosine"), default="linear",
                   help="the lr schedule: linear decay to 0 (written here in jnp) or optax's "
                        "cosine decay (optax.warmup_cosine_decay_schedule), over the run's steps")
    p.add_argument("--warmup", type=int, default=0,
                   help="optimizer steps of linear warmup from lr 0 (the first step's update is zero)")
    p.add_argument("--features", type=int, default=8, help="the MLP's inputs")
    p.add_argument("--seq", type=int, default=6,
                   help="the tokens loops' sequence positions (lengths 1..seq)")
    p.add_argument("--hidden", type=int, default=16, help="the MLP's hidden width")
    p.add_argument("--out", default="trace")
    p.add_argument("--no-record", dest="record", action="store_false")
    p.add_argument("--no-apply", dest="apply", action="store_false",
                   help="record without rec.apply (a second gradient per micro-batch)")
    p.add_argument("--wrap-inside", action="store_true",
                   help="jit the recorder's wrapper with your function (a callback records)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--identity", metavar="PATH",
                   help="the loop without the recorder first, then as asked, in this process: "
                   "both runs' parameter digests to PATH.rank0")
    args = p.parse_args(argv)
    if args.loop not in LOOPS:
        raise Refused("--loop: expected one of %s, got %r" % (", ".join(LOOPS), args.loop))
    if min(args.K, args.samples, args.epochs, args.features, args.hidden, args.seq) < 1:
        raise Refused("--K, --samples, --epochs, --features, --hidden and --seq must be >= 1")
    if args.identity:
        plain = digest(run(argparse.Namespace(**dict(vars(args), record=False))))
        trained = run(args)
        with open(args.identity + ".rank0", "w") as f:
            f.write(f"plain {plain}\nrecorded {digest(trained)}\n")
        return trained
    return run(args, mark)


if __name__ == "__main__":
    exit_on_refusal(main)
