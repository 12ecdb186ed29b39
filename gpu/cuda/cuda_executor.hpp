// The CUDA executor: the kernel bodies of gpu/kernels.hpp, the matrix
// product (kern::MatMul) included, launched on the GPU through one generic
// __global__ function (one thread per output element, one stream): the
// emulated executor's bits, no cuBLAS.  Built when nvcc is found
// (ACCUMCHECK_CUDA); usable from any C++ file.
//
//   std::string why;
//   if (!cuda_available(&why)) { /* skip, print why */ }
//   CudaExecutor ex;                       // throws with `why` if no GPU
//   Device<CudaExecutor> dev(spec, dataset, initial_params, ex);
//   // or CudaDevice dev(spec, dataset, initial_params);  (owns one)
//
// CudaExecutor::launch is defined only for nvcc (it is a template that
// instantiates a kernel): Device<CudaExecutor> is explicitly instantiated
// in cuda.cu, so host-compiled code uses the device without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/executor.hpp"

namespace accumcheck {

// True when a CUDA device can be used; otherwise false and, if `why` is
// given, one line such as "no CUDA device: cudaGetDeviceCount returned
// error 35 (CUDA driver version is insufficient for CUDA runtime
// version)".  Never throws.
bool cuda_available(std::string* why = nullptr);

// One line for a trace header: toolkit (compile time and runtime), driver,
// device name, architecture, SM count and the compiled architectures; or
// the toolkit and why no device is usable.
std::string cuda_trace_header();

// The SHA-256 of gpu/kernels.hpp this library was compiled against.
const char* cuda_kernel_source_digest();

// Evaluates one device-math function on the GPU for every x (0 exp, 1 log,
// 2 tanh, 3 erf, 4..7 activation identity/tanh/relu/gelu, 8..11 their
// derivatives): for bitwise comparisons with the CPU.  Throws without GPU.
std::vector<float> cuda_eval_math(int which, const std::vector<float>& xs);

// While another thread keeps the legacy default stream busy, `rounds` times:
// allocates n floats, launches a kernel that writes 1 to each, waits for
// the whole device, and counts the floats that read back as anything else.
// A test that a fresh buffer's zero fill is ordered before the first kernel
// on the executor's stream.
int64_t cuda_fresh_buffer_misses(int64_t n, int rounds);

namespace cuda_detail {
// Zero-filled on `stream` (a cudaStream_t): the fill is ordered before any
// later work on that stream.  A plain cudaMemset would run on the legacy
// default stream, which a cudaStreamNonBlocking stream does not wait for, so
// a kernel could race the fill (seen on an H100 with 16 processes sharing
// the GPU: gradients read back as zeros).
void* alloc_bytes(size_t bytes, void* stream);
void free_bytes(void* p) noexcept;
}  // namespace cuda_detail

class CudaExecutor {
 public:
  template <class T>
  class Buffer {
   public:
    Buffer() = default;
    Buffer(int64_t n, void* stream)
        : p_(static_cast<T*>(
              cuda_detail::alloc_bytes(size_t(n) * sizeof(T), stream))),
          n_(n) {}
    Buffer(Buffer&& o) noexcept
        : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    Buffer& operator=(Buffer&& o) noexcept {
      if (this != &o) {
        cuda_detail::free_bytes(p_);
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
      }
      return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { cuda_detail::free_bytes(p_); }
    T* data() { return p_; }
    const T* data() const { return p_; }
    int64_t size() const { return n_; }

   private:
    T* p_ = nullptr;
    int64_t n_ = 0;
  };

  // Device 0 and a stream.  Throws std::runtime_error("no CUDA device:
  // ...") when no GPU can be used.
  CudaExecutor();
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  template <class T>
  Buffer<T> alloc(int64_t n) {
    return Buffer<T>(n, stream_);
  }
  template <class T>
  void upload(Buffer<T>& dst, const T* src, int64_t n) {
    copy_h2d(dst.data(), src, size_t(n) * sizeof(T));
  }
  template <class T>
  void download(const Buffer<T>& src, T* dst, int64_t n) const {
    copy_d2h(dst, src.data(), size_t(n) * sizeof(T));
  }
  template <class Body>
  void launch(int64_t n, const Body& body);  // nvcc only (below)
  void synchronize();
  std::string describe() const;

 private:
  void copy_h2d(void* dst, const void* src, size_t bytes);
  void copy_d2h(void* dst, const void* src, size_t bytes) const;
  void check_launch(const char* what);

  void* stream_ = nullptr;  // cudaStream_t
};

#ifdef __CUDACC__
namespace cuda_detail {
template <class Body>
__global__ void run_body(Body body, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) body(i);
}
}  // namespace cuda_detail

template <class Body>
void CudaExecutor::launch(int64_t n, const Body& body) {
  if (n <= 0) return;
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  cuda_detail::run_body<Body><<<unsigned(blocks), unsigned(kBlock), 0,
                                static_cast<cudaStream_t>(stream_)>>>(body, n);
  check_launch(__PRETTY_FUNCTION__);
}
#endif

extern template class Device<CudaExecutor>;
using CudaDevice = Device<CudaExecutor>;
static_assert(Executor<CudaExecutor>);
static_assert(Engine<CudaDevice>);

}  // namespace accumcheck
