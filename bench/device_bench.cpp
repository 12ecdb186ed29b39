// One float32 training step of the device engine: forward_backward on a
// micro-batch of 32 plus an Adam step, MLP 256-512-10 (tanh or relu),
// cross-entropy.  Emulated executor (the kernels' own matrix product on
// the CPU's widest vector path; ACCUMCHECK_MATMUL_PATH picks another), and
// the CUDA executor when a GPU is present (reported skipped otherwise).
//
// BM_EmulatedStepSize: the same step at several sizes (issue 14: MLP
// 256-512-10 at batch 1, 32 and 256; 1024-4096-1024 at batch 32), with
// its matrix-product FLOPs per second (forward 2 B sum(in*out), weight
// gradients the same, input gradients for every layer but the first).
// BM_EmulatedMatMul: the matrix products of the 1024-4096-1024 b=32 and
// the 256-512-10 b=256 steps alone, with their FLOPs per second.
// BM_FmaPeak: this core's float32 FMA throughput, measured with 16
// independent chains of 512-bit (AVX-512) or 256-bit (AVX2) FMAs, the
// peak the side-by-side script divides by.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/emulated.hpp"
#include "sim/layout.hpp"
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "gpu/cuda/cuda_executor.hpp"
#endif

namespace accumcheck {
namespace {

constexpr int64_t kSamples = 1024, kBatch = 32;

ModelSpec model(Activation act) {
  return ModelSpec{{256, 512, 10}, act, LossKind::cross_entropy};
}

Dataset dataset(const ModelSpec& m, int64_t samples = kSamples) {
  Dataset d;
  d.n = samples;
  d.d_in = m.d_in();
  d.d_out = m.d_out();
  d.loss = m.loss;
  uint32_t s = 1;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return float(s >> 8) / 8388608.0f - 1.0f;
  };
  d.x.resize(size_t(samples * d.d_in));
  for (float& v : d.x) v = next();
  for (int64_t i = 0; i < samples; ++i)
    d.label.push_back(
        int32_t(uint32_t(std::fabs(next()) * 1e6f) % uint32_t(d.d_out)));
  return d;
}

std::vector<float> params(const ModelSpec& m) {
  const ParamLayout L = layout_of(m);
  std::vector<float> p(size_t(L.total));
  uint32_t s = 2;
  for (const TensorView& t : L.tensors)
    for (int64_t i = 0; i < t.size(); ++i) {
      s = s * 1664525u + 1013904223u;
      const float u = float(s >> 8) / 8388608.0f - 1.0f;
      p[size_t(t.offset + i)] = u / std::sqrt(float(t.fan_in));
    }
  return p;
}

template <class Dev>
void train_steps(benchmark::State& state, Dev& dev, int64_t batch_size = kBatch,
                 int64_t samples = kSamples) {
  OptimizerSpec opt;
  opt.kind = OptimizerKind::adam;
  int64_t batch = 0;
  std::vector<int64_t> ids(static_cast<size_t>(batch_size));
  for (auto _ : state) {
    for (int64_t i = 0; i < batch_size; ++i)
      ids[size_t(i)] = (batch * batch_size + i) % samples;
    ++batch;
    benchmark::DoNotOptimize(dev.forward_backward(ids, batch_size));
    dev.optimizer_step(opt, 1e-3);
    dev.zero_grad();
  }
  state.counters["steps/s"] = benchmark::Counter(double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

void BM_EmulatedAdamStep(benchmark::State& state) {
  const ModelSpec m = model(Activation(state.range(0)));
  EmulatedDevice dev(m, dataset(m), params(m));
  state.SetLabel(
      std::string(state.range(0) == int(Activation::tanh) ? "tanh" : "relu") +
      "; " + dev.executor().describe());
  train_steps(state, dev);
}
BENCHMARK(BM_EmulatedAdamStep)
    ->Arg(int(Activation::tanh))
    ->Arg(int(Activation::relu))
    ->Unit(benchmark::kMicrosecond);

// Args: d_in, hidden, d_out, batch.  One body for both executors.
template <class Dev>
void step_size(benchmark::State& state) {
  const ModelSpec m{{state.range(0), state.range(1), state.range(2)},
                    Activation::tanh,
                    LossKind::cross_entropy};
  const int64_t B = state.range(3);
  const int64_t n = std::max<int64_t>(4 * B, 256);
  Dev dev(m, dataset(m, n), params(m));
  train_steps(state, dev, B, n);
  const double w0 = double(m.widths[0] * m.widths[1]);
  const double w1 = double(m.widths[1] * m.widths[2]);
  const double flops = 2.0 * double(B) * (2 * (w0 + w1) + w1);
  state.counters["flops/s"] = benchmark::Counter(
      flops * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["params"] = double(layout_of(m).total);
}

void BM_EmulatedStepSize(benchmark::State& state) {
  step_size<EmulatedDevice>(state);
}
BENCHMARK(BM_EmulatedStepSize)
    ->Args({256, 512, 10, 1})
    ->Args({256, 512, 10, 32})
    ->Args({256, 512, 10, 256})
    ->Args({1024, 4096, 1024, 32})
    ->Unit(benchmark::kMicrosecond);

// One matrix product of the 1024-4096-1024 b=32 step, or of the 256-512-10
// b=256 step, alone (the emulated executor's, on its vector path): args m, n,
// k, ta, tb as gpu/device_impl.hpp launches them (forward z = a W^T, weight
// gradient dz^T a, input gradient dz W).
void BM_EmulatedMatMul(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  std::vector<float> a(size_t(m * k)), b(size_t(k * n)), c(size_t(m * n));
  uint32_t s = 3;
  for (std::vector<float>* v : {&a, &b})
    for (float& x : *v) {
      s = s * 1664525u + 1013904223u;
      x = float(s >> 8) / 8388608.0f - 1.0f;
    }
  EmulatedExecutor ex;
  const kern::MatMul mm{.a = a.data(),
                        .b = b.data(),
                        .c = c.data(),
                        .m = m,
                        .n = n,
                        .k = k,
                        .lda = ta ? m : k,
                        .ldb = tb ? k : n,
                        .ldc = n,
                        .ta = ta,
                        .tb = tb};
  for (auto _ : state) {
    ex.launch(m * n, mm);
    benchmark::DoNotOptimize(c.data());
  }
  state.SetLabel(emulated_detail::matmul_path());
  state.counters["flops/s"] =
      benchmark::Counter(2.0 * double(m * n * k) * double(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EmulatedMatMul)
    ->Args({32, 4096, 1024, 0, 1})  // forward, layer 1
    ->Args({32, 1024, 4096, 0, 1})  // forward, layer 2
    ->Args({1024, 4096, 32, 1, 0})  // weight gradient, layer 2
    ->Args({4096, 1024, 32, 1, 0})  // weight gradient, layer 1
    ->Args({32, 4096, 1024, 0, 0})  // input gradient, layer 2
    ->Args({256, 512, 256, 0, 1})   // MLP 256-512-10 b=256: forward
    ->Args({256, 10, 512, 0, 1})
    ->Args({512, 256, 256, 1, 0})  // weight gradients
    ->Args({10, 512, 256, 1, 0})
    ->Args({256, 512, 10, 0, 0})  // input gradient
    ->Unit(benchmark::kMicrosecond);

// 16 independent accumulators: FMA latency (4 cycles) x pipes (2) x a
// margin, so the loop is throughput-bound.  Intrinsics: the compiler must
// not split the FMA into a multiply and an add (ISO C++ does not contract).
__attribute__((target("avx512f,fma"), noinline)) float fma512(int64_t iters) {
  // Loads and stores only (GCC 12 warns inside _mm512_set1_ps).
  alignas(64) float buf[16];
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) {
    for (float& x : buf) x = float(j) * 1e-3f;
    acc[j] = _mm512_load_ps(buf);
  }
  for (float& x : buf) x = 0.999f;
  const __m512 a = _mm512_load_ps(buf);
  for (float& x : buf) x = 1e-4f;
  const __m512 b = _mm512_load_ps(buf);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  float s = 0;
  for (int j = 0; j < 16; ++j) {
    _mm512_store_ps(buf, acc[j]);
    for (float x : buf) s += x;
  }
  return s;
}
__attribute__((target("avx2,fma"), noinline)) float fma256(int64_t iters) {
  __m256 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm256_set1_ps(float(j) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  alignas(32) float out[8];
  float s = 0;
  for (int j = 0; j < 16; ++j) {
    _mm256_store_ps(out, acc[j]);
    for (float x : out) s += x;
  }
  return s;
}

void BM_FmaPeak(benchmark::State& state) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const int lanes = avx512 ? 16 : 8;
  constexpr int64_t kIters = 1 << 16;
  for (auto _ : state) {
    int64_t iters = kIters;
    benchmark::DoNotOptimize(iters);  // no constant folding of the loop
    benchmark::DoNotOptimize(avx512 ? fma512(iters) : fma256(iters));
  }
  state.SetLabel(avx512 ? "avx512" : "avx2");
  state.counters["flops/s"] =
      benchmark::Counter(double(state.iterations()) * kIters * 16 * lanes * 2,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak);

// Runs `body` when a GPU can be used; otherwise marks the benchmark skipped
// with the reason (no GPU, or a build without the CUDA executor).
template <class Body>
void on_cuda(benchmark::State& state, [[maybe_unused]] Body body) {
  std::string why = "built without the CUDA executor";
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
  if (cuda_available(&why)) {
    body();
    return;
  }
#endif
  state.SkipWithError(("skipped: " + why).c_str());
  for (auto _ : state) {
  }
}

void BM_CudaAdamStep(benchmark::State& state) {
  on_cuda(state, [&] {
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
    const ModelSpec m = model(Activation(state.range(0)));
    CudaDevice dev(m, dataset(m), params(m));
    state.SetLabel(cuda_trace_header());
    train_steps(state, dev);
#endif
  });
}
BENCHMARK(BM_CudaAdamStep)
    ->Arg(int(Activation::tanh))
    ->Arg(int(Activation::relu))
    ->Unit(benchmark::kMicrosecond);

// The same sizes on the GPU (wall time: every step ends in a device sync).
void BM_CudaStepSize(benchmark::State& state) {
  on_cuda(state, [&] {
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
    step_size<CudaDevice>(state);
#endif
  });
}
BENCHMARK(BM_CudaStepSize)
    ->Args({256, 512, 10, 1})
    ->Args({256, 512, 10, 32})
    ->Args({256, 512, 10, 256})
    ->Args({1024, 4096, 1024, 32})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace accumcheck

BENCHMARK_MAIN();
