// One float32 training step of the device engine: forward_backward on a
// micro-batch of 32 plus an Adam step, MLP 256-512-10 (tanh or relu),
// cross-entropy.  Emulated executor with single-threaded OpenBLAS, and
// the CUDA executor when a GPU is present (reported skipped otherwise).
#include <benchmark/benchmark.h>

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

Dataset dataset(const ModelSpec& m) {
  Dataset d;
  d.n = kSamples;
  d.d_in = m.d_in();
  d.d_out = m.d_out();
  d.loss = m.loss;
  uint32_t s = 1;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return float(s >> 8) / 8388608.0f - 1.0f;
  };
  d.x.resize(size_t(kSamples * d.d_in));
  for (float& v : d.x) v = next();
  for (int64_t i = 0; i < kSamples; ++i)
    d.label.push_back(int32_t(uint32_t(next() * 1e6f) % 10u));
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
void train_steps(benchmark::State& state, Dev& dev) {
  OptimizerSpec opt;
  opt.kind = OptimizerKind::adam;
  int64_t batch = 0;
  std::vector<int64_t> ids(kBatch);
  for (auto _ : state) {
    for (int64_t i = 0; i < kBatch; ++i)
      ids[size_t(i)] = (batch * kBatch + i) % kSamples;
    ++batch;
    benchmark::DoNotOptimize(dev.forward_backward(ids, kBatch));
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

void BM_CudaAdamStep(benchmark::State& state) {
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
  std::string why;
  if (!cuda_available(&why)) {
    state.SkipWithError(("skipped: " + why).c_str());
    for (auto _ : state) {
    }
    return;
  }
  const ModelSpec m = model(Activation(state.range(0)));
  CudaDevice dev(m, dataset(m), params(m));
  state.SetLabel(cuda_trace_header());
  train_steps(state, dev);
#else
  state.SkipWithError("skipped: built without the CUDA executor");
  for (auto _ : state) {
  }
#endif
}
BENCHMARK(BM_CudaAdamStep)
    ->Arg(int(Activation::tanh))
    ->Arg(int(Activation::relu))
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace accumcheck

BENCHMARK_MAIN();
