"""The JAX-based cases' shared part (optax_*.py, flax_*.py): the command
line bench/conformance.py passes (--out, --variant) and a run of
examples/jax/train_optax.py's loops with the release the venv holds.
Imports no torch (the torch cases' helper, _tiny.py, does)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "jax"))


def variant_args(variants, argv=None):
    """The case's command line, --variant one of `variants` ("default":
    the first)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", choices=variants + ["default"], default=variants[0])
    ap.add_argument("--identity", metavar="PATH",
                    help="the loop without the recorder first, then recorded, in this process: "
                    "both runs' parameter digests to PATH.rank0")
    a = ap.parse_args(argv)
    if a.variant == "default":
        a.variant = variants[0]
    return a


def run(variants, loops, argv=None):
    """train_optax with the variant's arguments (loops[variant]), exit 2 on
    a refusal, as the example's command line."""
    a = variant_args(variants, argv)
    import train_optax
    from accumcheck_jax import exit_on_refusal

    exit_on_refusal(train_optax.main, loops[a.variant] + ["--out", a.out, "--quiet"]
                    + (["--identity", a.identity] if a.identity else []))
