"""What a host callback costs a JAX program on the CPU backend (issue 46):
the recorder's taps are host callbacks in your programs (rec.apply's in
your gradient program, rec.optimizer's in your optimizer step), and
their cost there is not the callback's own work.  Each program is called
`--calls` times, its CPU time a call (this process, all its threads), the
least of `--repeats` rounds, the programs in turns:

  output          x + 1 on a (rows x cols) float32 array: a program whose
                  output is a new buffer of that size (your gradient, your
                  updated parameters)
  output+callback the same with a jax.pure_callback beside it (a scalar
                  result added to the output: the callback on its path)
  reduce          the sum of that array: a program with a small output
  reduce+callback the same with the callback
  grad            the wide MLP's (features x hidden x 4) summed loss's
                  gradient, jitted, on a micro-batch of --batch
  grad+tap        the same loss through the forward rec.apply wrapped
                  (the tap: u_j and the outputs handed to the host)

    .venv-jax/bin/python bench/jax_callback_cost.py [--rows 512 --cols 4096]
        [--features 512 --hidden 4096 --batch 16] [--calls 300] [--repeats 3]

Run it under `taskset -c 0` for one core's numbers.  The output
programs' times move with glibc's allocator state (a multi-MB buffer
freshly mapped page-faults once per page; GLIBC_TUNABLES's
glibc.malloc.mmap_threshold, set alone, made the plain output program
4.8 ms a call here): compare programs within one run.
"""

import argparse
import os
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "python"), os.path.join(here, "..", "examples", "jax")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import train_optax  # noqa: E402  (from examples/jax, put on the path above)


def zero(*_):
    return np.zeros((), np.int32)


def callback(x):
    """A scalar zero from the host, computed after x."""
    return jax.pure_callback(zero, jax.ShapeDtypeStruct((), jnp.int32), x)


def programs(args):
    from accumcheck_jax import ContractRecorder
    big = jnp.ones((args.rows, args.cols), jnp.float32)
    small = jnp.ones((16, 4), jnp.float32)
    params = train_optax.init_params(args.features, args.hidden, 4)
    rng = np.random.default_rng(0)
    batch = (jnp.asarray(rng.standard_normal((args.batch, args.features)).astype(np.float32)),
             jnp.asarray(rng.integers(0, 4, args.batch).astype(np.int32)))
    rec = ContractRecorder(lambda p, b: 0.0, lambda b: 1, accumulation=1,
                           out=os.path.join(tempfile.mkdtemp(), "trace"), quiet=True)
    tapped = rec.apply(train_optax.logits_of)

    def summed(forward):
        def loss(p, b):
            logp = jax.nn.log_softmax(forward(p, b[0]))
            return -jnp.sum(jnp.take_along_axis(logp, b[1][:, None], axis=1))
        return jax.jit(jax.grad(loss))

    def done():
        rec.taps.clear()  # the taps the tapped calls handed over, dropped
    return [
        ("output", jax.jit(lambda s, b: b + 1), (small, big)),
        ("output+callback", jax.jit(lambda s, b: b + callback(s).astype(b.dtype)), (small, big)),
        ("reduce", jax.jit(lambda s, b: jnp.sum(b)), (small, big)),
        ("reduce+callback", jax.jit(lambda s, b: jnp.sum(b) + callback(s).astype(b.dtype)),
         (small, big)),
        ("grad", summed(train_optax.logits_of), (params, batch)),
        ("grad+tap", summed(tapped), (params, batch)),
    ], done


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if min(args.rows, args.cols, args.features, args.hidden, args.batch, args.calls,
           args.repeats) < 1:
        p.error("every size, --calls and --repeats must be >= 1")
    progs, done = programs(args)
    for _, f, a in progs:
        jax.block_until_ready(f(*a))  # compiled before timing
    done()
    best = {name: float("inf") for name, _, _ in progs}
    for _ in range(args.repeats):
        for name, f, a in progs:
            c = time.process_time()
            out = None
            for _ in range(args.calls):
                out = f(*a)
            jax.block_until_ready(out)
            best[name] = min(best[name], (time.process_time() - c) / args.calls)
            done()
    print("jax %s, %s; load average %.2f; output %d x %d float32 (%.1f MB); the wide MLP "
          "%d-%d-4, micro-batch %d" % (jax.__version__, os.environ.get("GLIBC_TUNABLES", "glibc's "
                                       "default allocator"), os.getloadavg()[0], args.rows,
                                       args.cols, args.rows * args.cols * 4 / 1e6, args.features,
                                       args.hidden, args.batch))
    print("| program | CPU ms a call (least of %d rounds of %d calls) |" % (args.repeats, args.calls))
    print("| --- | --- |")
    for name, _, _ in progs:
        print("| %s | %.3f |" % (name, best[name] * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
