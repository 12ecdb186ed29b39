#!/usr/bin/env bash
# Side-by-side benchmark: the device engine's training step (MLP 256-512-10,
# batch 32, tanh, cross-entropy, Adam; emulated executor, OpenBLAS, one
# thread) beside the same step in PyTorch (Debian's python3-torch, one
# thread), with PyTorch on OpenBLAS and on Debian's reference BLAS; then the
# property battery's cases per second.  Run after scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
seconds=${BENCH_SECONDS:-3}

ours=$(./build/bench/device_bench --benchmark_filter='BM_EmulatedAdamStep/1$' \
         --benchmark_min_time="${seconds}" --benchmark_format=json 2>/dev/null |
       /usr/bin/python3 -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"][0]; print("%.1f" % b["steps/s"])')
torch_openblas=$(/usr/bin/python3 bench/pytorch_step.py "$seconds" | awk '{print $2}')
refblas=/usr/lib/x86_64-linux-gnu/blas
torch_ref=$(LD_LIBRARY_PATH=$refblas /usr/bin/python3 bench/pytorch_step.py "$seconds" | awk '{print $2}')
ratio() { /usr/bin/python3 -c "print(f'{$1 / $2:.2f}')"; }
printf '%-44s %12s\n' "training step, MLP 256-512-10, b=32, Adam" "steps/s"
printf '%-44s %12s\n' "accumcheck device engine (emulated, OpenBLAS)" "$ours"
printf '%-44s %12s   ratio %s\n' "PyTorch 1.13, OpenBLAS" "$torch_openblas" "$(ratio "$ours" "$torch_openblas")"
printf '%-44s %12s   ratio %s\n' "PyTorch 1.13, reference BLAS" "$torch_ref" "$(ratio "$ours" "$torch_ref")"

cases=${BENCH_CASES:-200}
start=$(date +%s.%N)
./build/cli/accumcheck check --cases "$cases" >/dev/null
end=$(date +%s.%N)
props=$(./build/cli/accumcheck check --list | wc -l)
/usr/bin/python3 -c "t=$end-$start; n=$props*$cases; print(f'property battery: {n} cases ({$props} properties x $cases) in {t:.1f} s = {n/t:.0f} cases/s')"
