#!/usr/bin/env bash
# The DeepSpeed cases' virtual environment: .venv-deepspeed/ with
# requirements-deepspeed.txt (torch 2.13.0's CPU wheel, deepspeed 0.19.8 from
# its sdist, ops JIT-built later).  Not part of scripts/venv.sh: it costs
# about 36 s of CPU and 2 to 3 minutes on a loaded 2-core machine.  Without
# it the PyTorch.systems.deepspeed.* cases are skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${ACCUMCHECK_PYTHON:-$(command -v python3.11 || command -v python3)}
start=$SECONDS
[ -x .venv-deepspeed/bin/python ] || "$python" -m venv .venv-deepspeed
grep -v '^deepspeed' requirements-deepspeed.txt > .venv-deepspeed/base.txt
.venv-deepspeed/bin/python -m pip install -q --disable-pip-version-check -r .venv-deepspeed/base.txt
DS_BUILD_OPS=0 .venv-deepspeed/bin/python -m pip install -q --disable-pip-version-check \
  --no-build-isolation -r requirements-deepspeed.txt
DS_ACCELERATOR=cpu .venv-deepspeed/bin/python -c 'import deepspeed' \
  || { echo "venv-deepspeed: .venv-deepspeed cannot import deepspeed" >&2; exit 1; }
echo "venv-deepspeed: ready in $((SECONDS - start)) s"
