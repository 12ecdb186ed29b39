// The CUDA executor (gpu/cuda/cuda_executor.hpp) and Device<CudaExecutor>,
// compiled by nvcc with --fmad=false from the same kernel bodies
// (gpu/kernels.hpp, via gpu/device_impl.hpp) as the emulated executor.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "gpu/cuda/cuda_executor.hpp"
#include "gpu/device_impl.hpp"
#include "gpu/kernels.hpp"
#include "gpu/shared_library.hpp"

namespace accumcheck {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + " returned error " + std::to_string(int(e)) +
         " (" + cudaGetErrorString(e) + ")";
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA: " + cuda_error(what, e));
}

// cuBLAS is loaded with dlopen when the first CudaExecutor needs it, not
// linked: libcublasLt alone is 540 MB, and mapping and relocating it cost
// about 0.5 s of CPU at every start of every program that links it (every
// `accumcheck` command and every test process, GPU or not; measured with
// `perf stat`: 512 ms for `accumcheck --help` linked, 17 ms without).
// The CUDA runtime is linked statically (nvcc's kernel registration needs it
// at start; gpu/cuda/CMakeLists.txt), and loads the driver, libcuda.so.1,
// itself at the first CUDA call: no GPU, driver or libcudart.so is needed
// to start.  The header still declares every function, so each
// pointer has the exact type of the function it names.
// One function a line (clang-format 14 reflows this list differently on
// each pass).
// clang-format off
#define ACCUMCHECK_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate) \
  X(cublasDestroy) \
  X(cublasSetStream) \
  X(cublasSetMathMode) \
  X(cublasSetAtomicsMode) \
  X(cublasSetWorkspace) \
  X(cublasSgemm) \
  X(cublasGetProperty) \
  X(cublasGetStatusName) \
  X(cublasGetStatusString)
// clang-format on

ACCUMCHECK_LIBRARY_API(CublasApi, ACCUMCHECK_CUBLAS_FUNCTIONS);

// The soname of the toolkit compiled against (libcublas.so.13), looked up
// the way the linker would (RUNPATH, LD_LIBRARY_PATH, ld.so.cache), then in
// the toolkit's library folder found at configure time.
const CublasApi& cublas() {
  static CublasApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname =
        "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    gpu_detail::load_library(
        api, soname, ACCUMCHECK_CUDA_LIBRARY_DIR, [&](void* lib) {
          ACCUMCHECK_CUBLAS_FUNCTIONS(ACCUMCHECK_LIBRARY_RESOLVE)
        });
  });
  return api;
}

const CublasApi& cublas_or_throw() {
  const CublasApi& api = cublas();
  if (!api.error.empty()) throw std::runtime_error("cuBLAS: " + api.error);
  return api;
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + what + " returned " +
                             cublas().cublasGetStatusName(s) + " (" +
                             cublas().cublasGetStatusString(s) + ")");
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cublasHandle_t as_blas(void* h) { return static_cast<cublasHandle_t>(h); }

cublasOperation_t op(Trans t) {
  return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

int to_int(int64_t v) {
  if (v < 0 || v > int64_t(2147483647))
    throw std::length_error("CudaExecutor::gemm: dimension " +
                            std::to_string(v) + " out of cuBLAS range");
  return int(v);
}

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
  if (const CublasApi& blas = cublas(); blas.error.empty()) {
    int major = 0, minor = 0, patch = 0;
    blas.cublasGetProperty(MAJOR_VERSION, &major);
    blas.cublasGetProperty(MINOR_VERSION, &minor);
    blas.cublasGetProperty(PATCH_LEVEL, &patch);
    s += ", cuBLAS " + std::to_string(major) + "." + std::to_string(minor) +
         "." + std::to_string(patch);
  } else {
    s += ", cuBLAS not loaded (" + blas.error + ")";
  }
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
  const CublasApi& blas = cublas_or_throw();
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
        "cudaStreamCreate");
  stream_ = stream;
  cublasHandle_t h = nullptr;
  const cublasStatus_t st = blas.cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    check(st, "cublasCreate");
  }
  blas_ = h;
  try {
    check(blas.cublasSetStream(h, stream), "cublasSetStream");
    // No TF32 or other reduced-precision paths, no atomics, a fixed
    // workspace: cuBLAS results are then reproducible run to run on one
    // GPU architecture and toolkit.
    check(blas.cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    check(blas.cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED),
          "cublasSetAtomicsMode");
    check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc(workspace)");
    check(blas.cublasSetWorkspace(h, workspace_, kWorkspaceBytes),
          "cublasSetWorkspace");
  } catch (...) {
    blas.cublasDestroy(h);
    cudaStreamDestroy(stream);
    if (workspace_) cudaFree(workspace_);
    throw;
  }
}

CudaExecutor::~CudaExecutor() {
  if (stream_) (void)cudaStreamSynchronize(as_stream(stream_));
  if (blas_) cublas().cublasDestroy(as_blas(blas_));
  if (workspace_) cudaFree(workspace_);
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

void CudaExecutor::gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float* a, int64_t lda,
                        const float* b, int64_t ldb, float beta, float* c,
                        int64_t ldc) {
  if (m == 0 || n == 0) return;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // row-major buffers read as column-major are the transposes, so the
  // operands swap places and keep their op flags.
  check(cublas().cublasSgemm(as_blas(blas_), op(tb), op(ta), to_int(n),
                             to_int(m), to_int(k), &alpha, b, to_int(ldb), a,
                             to_int(lda), &beta, c, to_int(ldc)),
        "cublasSgemm");
}

std::string CudaExecutor::describe() const {
  return "CUDA executor: " + cuda_trace_header();
}

template class Device<CudaExecutor>;

}  // namespace accumcheck
