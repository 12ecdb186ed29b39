#!/usr/bin/env bash
# The DeepSpeed cases' virtual environment: .venv-deepspeed/ with
# requirements-deepspeed.txt (deepspeed 0.19.8 from its sdist, ops
# JIT-built later), layered on the project's .venv/ (scripts/venv.sh) as the
# framework venvs are (bench/conformance.py): a .pth file puts .venv's
# site-packages on its path, so torch 2.13.0 and requirements.txt's pins
# are installed once, and pip must keep them (requirements.txt is passed as
# constraints).  Not part of scripts/venv.sh; `scripts/test.sh --deepspeed`
# makes it.  Without it the PyTorch.systems.deepspeed.* cases are skipped
# with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "venv-deepspeed: no .venv: run scripts/venv.sh first" >&2; exit 1; }
start=$SECONDS
[ -x .venv-deepspeed/bin/python ] || .venv/bin/python -m venv .venv-deepspeed
base=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
site=$(.venv-deepspeed/bin/python -c 'import site; print(site.getsitepackages()[0])')
echo "$base" > "$site/_accumcheck_base.pth"
# deepspeed's setup.py imports torch: it is built without isolation,
# after torch and the build tools of requirements-deepspeed.txt.
grep -v '^deepspeed' requirements-deepspeed.txt > .venv-deepspeed/base.txt
.venv-deepspeed/bin/python -m pip install -q --disable-pip-version-check \
  -c requirements.txt -r .venv-deepspeed/base.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
DS_BUILD_OPS=0 .venv-deepspeed/bin/python -m pip install -q --disable-pip-version-check \
  --no-build-isolation -c requirements.txt -r requirements-deepspeed.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
DS_ACCELERATOR=cpu .venv-deepspeed/bin/python -c \
  'import torch, deepspeed; assert torch.__version__.startswith("2.13.0"), torch.__version__' \
  || { echo "venv-deepspeed: .venv-deepspeed cannot import deepspeed with torch 2.13.0" >&2; exit 1; }
echo "venv-deepspeed: ready in $((SECONDS - start)) s"
