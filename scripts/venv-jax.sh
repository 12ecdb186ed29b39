#!/usr/bin/env bash
# The JAX and Keras cases' virtual environment: .venv-jax/ with
# requirements-jax.txt (jax and jaxlib's CPU wheels, optax, flax, keras),
# layered on the project's .venv/ (scripts/venv.sh) as .venv-deepspeed/ is:
# a .pth file puts .venv's site-packages on its path, so numpy and torch
# 2.13.0 are installed once, and pip must keep them (requirements.txt is
# passed as constraints).  Keras is checked on its JAX backend
# (KERAS_BACKEND=jax; its default, TensorFlow, is not installed).  Rebuilt only when requirements-jax.txt changes
# (its hash in .venv-jax/.requirements.sha256).  scripts/test.sh makes it
# while the C++ builds; without it the JAX.* cases are skipped with a
# message.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "venv-jax: no .venv: run scripts/venv.sh first" >&2; exit 1; }
want=$(cat requirements.txt requirements-jax.txt | sha256sum | cut -d' ' -f1)
if [ -x .venv-jax/bin/python ] && [ "$(cat .venv-jax/.requirements.sha256 2>/dev/null)" = "$want" ]; then
  echo "venv-jax: .venv-jax up to date"
  exit 0
fi
start=$SECONDS
[ -x .venv-jax/bin/python ] || .venv/bin/python -m venv .venv-jax
base=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
site=$(.venv-jax/bin/python -c 'import site; print(site.getsitepackages()[0])')
echo "$base" > "$site/_accumcheck_base.pth"
.venv-jax/bin/python -m pip install -q --disable-pip-version-check \
  -c requirements.txt -r requirements-jax.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
KERAS_BACKEND=jax .venv-jax/bin/python -c '
import torch, jax, optax, flax, keras
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("venv-jax: jax", jax.__version__, "optax", optax.__version__, "flax", flax.__version__,
      "keras", keras.__version__)' \
  || { echo "venv-jax: .venv-jax cannot import jax, optax, flax and keras beside torch 2.13.0" >&2; exit 1; }
echo "$want" > .venv-jax/.requirements.sha256
echo "venv-jax: ready in $((SECONDS - start)) s"
