#!/usr/bin/env bash
# Side-by-side benchmark: the device engine's training step (tanh MLP,
# cross-entropy, Adam; emulated executor, one thread) beside the
# same step in PyTorch 2.13 (the project's .venv, one thread; its wheel brings
# its own BLAS); then the step at several sizes
# (issue 14) as a fraction of this core's float32 peak, and what bounds
# each; then the property battery's cases per second.
# Run after scripts/build.sh.
#
# The peak of one core: FMA width from the CPU flags (avx512f: 16 float32
# lanes, else avx2: 8), 2 FMA pipes per core (every x86 core since Intel
# Haswell and AMD Zen 2; AMD Zen 5, CPU family 26, has two 512-bit FMA
# pipes), 2 flops per FMA lane, and the clock: /proc/cpuinfo's MHz is the
# nominal clock, while the core runs boosted, so the clock is measured:
# bench/device_bench.cpp's BM_FmaPeak (16 independent FMA chains, CPU time)
# divided by pipes x lanes x 2.  Peak = pipes x lanes x 2 x measured clock
# (= the FMA loop's rate); the nominal-clock peak is printed beside it.
# Everything here runs on one core.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
seconds=${BENCH_SECONDS:-3}
py=.venv/bin/python
export PYTHONPATH=$PWD/python
bench=./build/bench/device_bench

json() { $bench --benchmark_filter="$1" --benchmark_min_time="$2" --benchmark_format=json 2>/dev/null; }
ours=$(json 'BM_EmulatedAdamStep/1$' "$seconds" |
       $py -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"][0]; print("%.1f" % b["steps/s"])')
torch_openblas=$($py bench/pytorch_step.py "$seconds" | awk '{print $2}')
ratio() { $py -c "print(f'{$1 / $2:.2f}')"; }
printf '%-44s %12s\n' "training step, MLP 256-512-10, b=32, Adam" "steps/s"
printf '%-44s %12s\n' "accumcheck device engine (emulated)" "$ours"
printf '%-44s %12s   ratio %s\n' "PyTorch $($py -c 'import torch; print(torch.__version__)')" "$torch_openblas" "$(ratio "$ours" "$torch_openblas")"

# ------------------------------------------------ sizes and the peak
model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
mhz=$(grep -m1 'cpu MHz' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
cores=$(getconf _NPROCESSORS_ONLN)
lanes=8; grep -qw avx512f /proc/cpuinfo && lanes=16
fma=$(json 'BM_FmaPeak' 1 | $py -c 'import json,sys; print(json.load(sys.stdin)["benchmarks"][0]["flops/s"])')
pipes=2
read -r peak ghz nominal <<<"$($py -c "
f=$fma; per=$pipes*$lanes*2
print(f, '%.2f' % (f/per/1e9), per*$mhz*1e6)")"
echo "peak: $model, $cores cores, nominal $mhz MHz; $lanes float32 lanes per FMA (flags), $pipes FMA pipes per core"
echo "      FMA loop $($py -c "print(f'{$fma/1e9:.1f}')") GFLOP/s = $pipes x $lanes x 2 x $ghz GHz (boost); one core's peak $($py -c "print(f'{$peak/1e9:.1f}')") GFLOP/s (at the nominal clock $($py -c "print(f'{$nominal/1e9:.1f}')"))"
printf '%-26s %10s %10s %9s %8s %10s %9s  %s\n' "step (tanh, CE, Adam)" params "steps/s" "GFLOP/s" "of peak" "torch st/s" "of peak" "bound by"
sizes=("256 512 10 1" "256 512 10 32" "256 512 10 256" "1024 4096 1024 32")
json 'BM_EmulatedStepSize' "$seconds" >/tmp/accumcheck_sizes.$$.json
for i in "${!sizes[@]}"; do
  read -r din hid dout b <<<"${sizes[$i]}"
  read -r params sps fl <<<"$($py -c "
import json; b=json.load(open('/tmp/accumcheck_sizes.$$.json'))['benchmarks'][$i]
print(int(b['params']), '%.1f' % b['steps/s'], b['flops/s'])")"
  tsps=$($py bench/pytorch_step.py "$seconds" "$din" "$hid" "$dout" "$b" | awk '{print $2}')
  read -r gf frac tfrac bound <<<"$($py -c "
fl=$fl; peak=$peak; sps=$sps; t=$tsps; params=$params; b=$b
per_step=fl/sps
frac=fl/peak; tfrac=per_step*t/peak
# Arithmetic intensity of the matrix products: 2 flops per weight per
# sample against 4 bytes of weight streamed per product (x3: forward,
# dW, dX), plus Adam's ~16 bytes x 4 arrays per parameter per step.
flops_per_byte = per_step / (params*4*3 + params*16*4)
bound = 'overhead (per-call, tiny GEMV)' if b == 1 else ('memory (Adam + weights streamed; %.1f flop/B)' % flops_per_byte if flops_per_byte < 8 else 'compute (GEMM; %.0f flop/B)' % flops_per_byte)
print('%.2f' % (fl/1e9), '%.1f%%' % (100*frac), '%.1f%%' % (100*tfrac), bound.replace(' ', '_'))")"
  printf '%-26s %10s %10s %9s %8s %10s %9s  %s\n' "MLP $din-$hid-$dout b=$b" "$params" "$sps" "$gf" "$frac" "$tsps" "$tfrac" "${bound//_/ }"
done
rm -f /tmp/accumcheck_sizes.$$.json
echo

cases=${BENCH_CASES:-200}
start=$(date +%s.%N)
./build/cli/accumcheck check --cases "$cases" >/dev/null
end=$(date +%s.%N)
props=$(./build/cli/accumcheck check --list | wc -l)
$py -c "t=$end-$start; n=$props*$cases; print(f'property battery: {n} cases ({$props} properties x $cases) in {t:.1f} s = {n/t:.0f} cases/s')"
