// The CUDA executor (gpu/cuda/cuda_executor.hpp) and Device<CudaExecutor>,
// compiled by nvcc with --fmad=false from the same kernel bodies
// (gpu/kernels.hpp, via gpu/device_impl.hpp), the matrix product
// included, as the emulated executor: no cuBLAS.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "gpu/cuda/cuda_executor.hpp"
#include "gpu/device_impl.hpp"
#include "gpu/kernels.hpp"

namespace accumcheck {

namespace {

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + " returned error " + std::to_string(int(e)) +
         " (" + cudaGetErrorString(e) + ")";
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA: " + cuda_error(what, e));
}

// The CUDA runtime is linked statically (nvcc's kernel registration needs it
// at start; gpu/cuda/CMakeLists.txt) and loads the driver, libcuda.so.1,
// itself at the first CUDA call: no GPU, driver or libcudart.so is needed
// to start.

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

std::string version_string(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

bool cuda_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    // The runtime reports a driver it cannot load (none installed: a
    // machine without a GPU) as an insufficient one: say which.
    std::string what = "no CUDA device: ";
    if (e == cudaErrorInsufficientDriver) {
      if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL))
        dlclose(driver);
      else
        what += "no CUDA driver (libcuda.so.1 not found): ";
    }
    if (why) *why = what + cuda_error("cudaGetDeviceCount", e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device: cudaGetDeviceCount found 0 devices";
    return false;
  }
  if (why) why->clear();
  return true;
}

std::string cuda_trace_header() {
  std::string s = "CUDA toolkit " + version_string(CUDART_VERSION);
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
    s += ", runtime " + version_string(rt);
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
    s += ", driver " + version_string(drv);
  s += ", compiled for " ACCUMCHECK_CUDA_ARCHS_STRING;
  std::string why;
  if (!cuda_available(&why)) return s + "; " + why;
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return s + "; device properties unavailable";
  }
  s += "; device " + std::to_string(dev) + ": " + p.name + ", sm_" +
       std::to_string(p.major) + std::to_string(p.minor) + ", " +
       std::to_string(p.multiProcessorCount) + " SMs";
  return s;
}

const char* cuda_kernel_source_digest() { return kern::kKernelSourceDigest; }

namespace cuda_detail {

void* alloc_bytes(size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  const cudaError_t e = cudaMemsetAsync(p, 0, bytes, as_stream(stream));
  if (e != cudaSuccess) {
    (void)cudaFree(p);
    check(e, "cudaMemsetAsync");
  }
  return p;
}

void free_bytes(void* p) noexcept {
  if (p) (void)cudaFree(p);
}

// One thread per x: evaluates device-math function `which`.
struct EvalMath {
  const float* x;
  float* y;
  int which;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const float v = x[i];
    float r = 0;
    if (which == 0)
      r = dm::ac_expf(v);
    else if (which == 1)
      r = dm::ac_logf(v);
    else if (which == 2)
      r = dm::ac_tanhf(v);
    else if (which == 3)
      r = dm::ac_erff(v);
    else if (which < 8)
      r = kern::activation(kern::Act(which - 4), v);
    else {
      const kern::Act act = kern::Act(which - 8);
      r = kern::activation_derivative(act, v, kern::activation(act, v));
    }
    y[i] = r;
  }
};

struct FillOne {
  float* y;
  ACCUMCHECK_HD void operator()(int64_t i) const { y[i] = 1.0f; }
};

// Keeps the legacy default stream busy for about `cycles` clock ticks.
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace cuda_detail

int64_t cuda_fresh_buffer_misses(int64_t n, int rounds) {
  CudaExecutor ex;
  // Another host thread keeps the legacy default stream busy with short
  // kernels (as another library's work would): a fill queued on that stream
  // waits behind them, while the executor's non-blocking stream does not.
  std::atomic<bool> stop{false};
  std::thread busy([&stop] {
    while (!stop.load()) cuda_detail::spin<<<1, 1>>>(200'000LL);
  });
  int64_t misses = 0;
  try {
    for (int r = 0; r < rounds; ++r) {
      auto y = ex.alloc<float>(n);
      ex.launch(n, cuda_detail::FillOne{y.data()});
      ex.synchronize();
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      std::vector<float> out(size_t(n), 0.0f);
      ex.download(y, out.data(), n);
      for (const float v : out) misses += v != 1.0f;
    }
  } catch (...) {
    stop = true;
    busy.join();
    throw;
  }
  stop = true;
  busy.join();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return misses;
}

std::vector<float> cuda_eval_math(int which, const std::vector<float>& xs) {
  CudaExecutor ex;
  const int64_t n = int64_t(xs.size());
  auto x = ex.alloc<float>(n);
  auto y = ex.alloc<float>(n);
  ex.upload(x, xs.data(), n);
  ex.launch(n, cuda_detail::EvalMath{x.data(), y.data(), which});
  std::vector<float> out(xs.size());
  ex.download(y, out.data(), n);
  return out;
}

CudaExecutor::CudaExecutor() {
  std::string why;
  if (!cuda_available(&why)) throw std::runtime_error(why);
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
        "cudaStreamCreate");
  stream_ = stream;
}

CudaExecutor::~CudaExecutor() {
  if (stream_) (void)cudaStreamSynchronize(as_stream(stream_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

void CudaExecutor::copy_h2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                        as_stream(stream_)),
        "cudaMemcpyAsync(h2d)");
  // The host buffer may go away when we return.
  check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
}

void CudaExecutor::copy_d2h(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                        as_stream(stream_)),
        "cudaMemcpyAsync(d2h)");
  check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
}

void CudaExecutor::check_launch(const char* what) {
  check(cudaGetLastError(), what);
}

void CudaExecutor::synchronize() {
  check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
}

std::string CudaExecutor::describe() const {
  return "CUDA executor: " + cuda_trace_header();
}

template class Device<CudaExecutor>;

}  // namespace accumcheck
