#!/usr/bin/env bash
# The Python side's virtual environment: .venv/ with requirements.txt's
# pinned packages (torch 2.13.0's CPU wheel, pytest), the interpreter CMake
# and CTest use.  Rebuilt only when requirements.txt changes (its hash is
# kept in .venv/.requirements.sha256); ACCUMCHECK_NO_TORCH=1 skips it (the
# PyTorch tests are then skipped with their reason).
#   bash scripts/venv.sh                .venv/ with every package
#   bash scripts/venv.sh --interpreter  only .venv/bin/python, in a few
#                                       seconds: CMake's first configure
#                                       records that path (scripts/test.sh
#                                       installs the packages beside the
#                                       build)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${ACCUMCHECK_NO_TORCH:-0}" = 1 ] && { echo "venv: skipped (ACCUMCHECK_NO_TORCH=1)"; exit 0; }
interpreter_only=0
case "${1:-}" in
  "") ;;
  --interpreter) interpreter_only=1 ;;
  *) echo "usage: $0 [--interpreter]" >&2; exit 2 ;;
esac
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat .venv/.requirements.sha256 2>/dev/null)" = "$want" ]; then
  echo "venv: .venv up to date ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
python=${ACCUMCHECK_PYTHON:-$(command -v python3.11 || command -v python3)}
start=$SECONDS
[ -x .venv/bin/python ] || "$python" -m venv .venv
[ "$interpreter_only" = 1 ] && exit 0
# pip compiles the bytecode once here (about 15 s of CPU for torch): every
# test starts fresh interpreters, and where PYTHONDONTWRITEBYTECODE is set
# (as on these machines) none would be written later: `import torch` then
# costs 2.9 instead of 1.3 s of CPU, in each of several hundred processes.
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c 'import torch, pytest' \
  || { echo "venv: .venv cannot import torch and pytest after pip install" >&2; exit 1; }
echo "$want" > .venv/.requirements.sha256
echo "venv: .venv ready in $((SECONDS - start)) s ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
