"""Where the JAX recorder's cost goes inside a training loop (issue 46):
examples/jax/train_optax.py's hand loop (Adam through
optax.inject_hyperparams, your gradient jitted, a window's gradients
summed by a jitted add, then one jitted step), run four ways in turns:

  plain           the loop as it is
  callbacks       the same programs with a no-op host callback where the
                  recorder puts its own: in the forward's backward (as
                  rec.apply's tap) and in the optimizer's state (as
                  rec.optimizer's): what a callback costs in the loop
  callbacks+takes the step's callback also handed the recorder's kept
                  coordinates of the gradient the optimizer consumed and
                  of the update it returned (what rec.optimizer reads)
  recorded        accumcheck_jax.ContractRecorder: rec.apply, rec.grad,
                  rec.optimizer

Each phase is waited on (jax.block_until_ready) and timed in CPU time
(this process, all its threads) with its minor page faults: the
gradient call (its recorder work included), the add, the step.  On the
CPU backend a program with a host callback runs in the thread that calls
it, so the recorded loop waits there anyway.  The first window (the
compilations) is left out; the least of --repeats rounds per phase.

    .venv-jax/bin/python bench/jax_loop_phases.py [--features 512 --hidden 4096]
        [--samples 1024 --batch 16 --K 4 --epochs 4] [--repeats 3] [--hlo]

--hlo prints, for the step program with and without the takes, the
compiled fusions that write a buffer as large as the largest parameter:
the buffers the program materializes.  Run it under `taskset -c 0` for
one core's numbers; a run's page faults, and with them its CPU time, move
with glibc's allocator state (compare the ways within one run).
"""

import argparse
import collections
import os
import re
import resource
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "python"), os.path.join(here, "..", "examples", "jax")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import train_optax  # noqa: E402  (from examples/jax, put on the path above)

WAYS = ("plain", "callbacks", "callbacks+takes", "recorded")


def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def tapped_forward():
    """train_optax.logits_of with a no-op host callback in its backward,
    handed the outputs and their cotangent and put on your gradient's path
    as rec.apply puts its tap (accumcheck_jax.outputs.tap_on_gradient)."""
    from accumcheck_jax.outputs import tap_on_gradient

    def nothing(dtype, *_):
        return np.zeros((), dtype)

    @jax.custom_vjp
    def forward(params, x):
        return train_optax.logits_of(params, x)

    def fwd(params, x):
        out, vjp = jax.vjp(train_optax.logits_of, params, x)
        return out, (vjp, out)

    def bwd(res, u):
        vjp, out = res
        cts = vjp(u)
        return (tap_on_gradient(jax, cts[0], nothing, [out, u]), cts[1])
    forward.defvjp(fwd, bwd)
    return forward


def told_optimizer(tx, layout):
    """tx with a no-op callback in the state it returns (accumcheck_jax's
    _told); layout given: handed the kept coordinates of the consumed
    gradient and of the update, and the lr, as rec.optimizer hands them."""
    from accumcheck_jax.capture import _lr_of, _pack, _told

    def update(grads, state, params=None):
        updates, new = tx.update(grads, state, params)
        g = jax.tree_util.tree_leaves(grads)
        if layout is None:
            args = (g[-1][:1],)
        else:
            args = (_pack(jnp, layout.take(jnp, g)),
                    _pack(jnp, layout.take(jnp, jax.tree_util.tree_leaves(updates))), _lr_of(new))
        return updates, _told(jax, lambda *a: None, new, *args)
    return optax.GradientTransformation(tx.init, update)


def build(way, args, out):
    """(gradient function, the step's tx, the recorder or None)."""
    from accumcheck_jax import ContractRecorder
    from accumcheck_jax.capture import _Leaves
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    if way == "plain":
        return jax.jit(jax.grad(train_optax.summed_loss)), tx, None
    if way == "recorded":
        box = {}
        summed = train_optax.losses(lambda p, x: box["forward"](p, x))[0]
        rec = ContractRecorder(summed, train_optax.items, accumulation=args.K, out=out,
                               quiet=True)
        box["forward"] = rec.apply(train_optax.logits_of)
        return rec.grad(jax.jit(jax.grad(summed))), rec.optimizer(tx), rec
    summed = train_optax.losses(tapped_forward())[0]
    shapes = [x.shape for x in jax.tree_util.tree_leaves(
        train_optax.init_params(args.features, args.hidden, 4))]
    layout = _Leaves(shapes, 4096, 0) if way == "callbacks+takes" else None
    return jax.jit(jax.grad(summed)), told_optimizer(tx, layout), None


def step_program(tx):
    @jax.jit
    def step(params, state, acc, scale):
        grads = jax.tree_util.tree_map(lambda a: a * scale, acc)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    return step


def run(way, args, batches):
    """{phase: (CPU s, faults, count)} of one loop, the first window left out."""
    with tempfile.TemporaryDirectory() as tmp:
        grad_fn, tx, rec = build(way, args, os.path.join(tmp, "trace"))
        params = train_optax.init_params(args.features, args.hidden, 4)
        state = tx.init(params)
        step = step_program(tx)
        add = jax.jit(lambda a, g: jax.tree_util.tree_map(jnp.add, a, g))
        took = collections.defaultdict(lambda: [0.0, 0, 0])
        timed = False

        def phase(name, fn, *a):
            f, c = faults(), time.process_time()
            out = jax.block_until_ready(fn(*a))
            if timed:
                t = took[name]
                t[0] += time.process_time() - c
                t[1] += faults() - f
                t[2] += 1
            return out

        for _ in range(args.epochs):
            drawn = rec.watch(batches) if rec else batches
            acc, n, w = None, 0, 0
            for b in drawn:
                b = (jnp.asarray(b[0]), jnp.asarray(b[1]))
                g = phase("gradient", grad_fn, params, b)
                acc = g if acc is None else phase("add", add, acc, g)
                n, w = n + len(b[1]), w + 1
                if w == args.K:
                    params, state = phase("step", step, params, state, acc, jnp.float32(1.0 / n))
                    timed = True
                    acc, n, w = None, 0, 0
        if rec:
            c = time.process_time()
            rec.close(params)
            took["close"] = [time.process_time() - c, 0, 1]
        return dict(took)


def fused_buffers(tx, params):
    """The compiled step's fusions writing a buffer the size of the largest
    parameter (name, shape)."""
    big = max(jax.tree_util.tree_leaves(params), key=lambda x: x.size)
    shape = "f32[%s]" % ",".join(str(d) for d in big.shape)
    acc = jax.tree_util.tree_map(jnp.ones_like, params)
    text = step_program(tx).lower(params, tx.init(params), acc, jnp.float32(1.0)).compile().as_text()
    entry = text[text.index("ENTRY"):]
    return [m.group(1) for m in re.finditer(r"%(\S+) = " + re.escape(shape) + r"\{[^}]*\} fusion\(",
                                            entry)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--K", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hlo", action="store_true",
                   help="print the step program's parameter-sized fusions with and without the takes")
    args = p.parse_args()
    if min(args.features, args.hidden, args.samples, args.batch, args.K, args.epochs,
           args.repeats) < 1:
        p.error("every size and count must be at least 1")
    x, y = train_optax.data(args.samples, args.features, 4)
    batches = train_optax.micro_batches(x, y, [args.batch])
    print("jax %s, %d micro-batches of %d, K %d, %d epochs; load average %.2f"
          % (jax.__version__, len(batches), args.batch, args.K, args.epochs, os.getloadavg()[0]))
    best = {}
    for _ in range(args.repeats):
        for way in WAYS:
            for name, (cpu, flt, n) in run(way, args, batches).items():
                per = (cpu / n, flt / n)
                old = best.get((way, name))
                best[(way, name)] = per if old is None or per[0] < old[0] else old
    print("| way | gradient ms a micro-batch (faults) | add ms (faults) | step ms a step (faults) "
          "| close s |")
    print("| --- | --- | --- | --- | --- |")
    for way in WAYS:
        cells = []
        for name in ("gradient", "add", "step"):
            cpu, flt = best[(way, name)]
            cells.append("%.2f (%d)" % (cpu * 1e3, flt))
        close = best.get((way, "close"))
        print("| %s | %s | %s |" % (way, " | ".join(cells), "%.3f" % close[0] if close else "-"))
    if args.hlo:
        from accumcheck_jax.capture import _Leaves
        params = train_optax.init_params(args.features, args.hidden, 4)
        layout = _Leaves([v.shape for v in jax.tree_util.tree_leaves(params)], 4096, 0)
        tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
        for way, t in (("callbacks", told_optimizer(tx, None)),
                       ("callbacks+takes", told_optimizer(tx, layout))):
            found = fused_buffers(t, params)
            print("step program, %s: %d parameter-sized fusions: %s" % (way, len(found),
                                                                     ", ".join(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
