#!/usr/bin/env bash
# cuBLAS's headers for the CUDA executor (gpu/cuda/cuda.cu includes
# cublas_v2.h; the library itself is loaded with dlopen at run time, so only
# the headers are needed to build).  A toolkit that ships them is used as
# it is; one without them (a toolkit assembled from NVIDIA's pip wheels, as
# on these machines) gets them from PyPI's nvidia-cublas wheel, pinned by
# version and SHA-256, unpacked into third_party/cublas/include.  No nvcc:
# nothing to do.  Idempotent: present headers are kept, the network is not
# touched.  Called by scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ -x /usr/local/cuda/bin/nvcc ] || exit 0
for d in /usr/local/cuda/include /usr/local/cuda/targets/*/include; do
  [ -f "$d/cublas_v2.h" ] && exit 0
done
dest=third_party/cublas/include
[ -f "$dest/cublas_v2.h" ] && exit 0
version=13.0.2.14
sha256=0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c
python=${ACCUMCHECK_PYTHON:-$(command -v python3.11 || command -v python3)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --no-deps --only-binary=:all: -q -d "$tmp" "nvidia-cublas==$version" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
wheel=$(ls "$tmp"/nvidia_cublas-"$version"-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "cublas_headers: pip download nvidia-cublas==$version failed" >&2; exit 1; }
echo "$sha256  $wheel" | sha256sum --check --status ||
  { echo "cublas_headers: $(basename "$wheel") does not have the pinned SHA-256" >&2; exit 1; }
mkdir -p "$tmp/include"
"$python" - "$wheel" "$tmp/include" <<'PY'
import sys, zipfile, os
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if "/include/" in n and n.endswith(".h"):
            with open(os.path.join(sys.argv[2], os.path.basename(n)), "wb") as f:
                f.write(z.read(n))
PY
mkdir -p third_party/cublas
rm -rf "$dest"
mv "$tmp/include" "$dest"
echo "cublas_headers: $dest (nvidia-cublas $version)"
