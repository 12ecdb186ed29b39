// The emulated executor: the kernel bodies of gpu/kernels.hpp run in plain
// loops on the CPU, one thread, no library (the matrix product is the
// kern::MatMul body, run many outputs at a time; gpu/emulated.cpp).  Always
// built; it is the float32 engine every CI run exercises.  Its bits are the
// same on every x86-64 CPU, and the CUDA executor's.
//
//   EmulatedExecutor ex;
//   Device<EmulatedExecutor> dev(spec, dataset, initial_params, ex);
//   // or: EmulatedDevice dev(spec, dataset, initial_params);  (owns one)
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/executor.hpp"
#include "sim/trainer.hpp"

namespace accumcheck {

class EmulatedExecutor {
 public:
  template <class T>
  class Buffer {
   public:
    Buffer() = default;
    explicit Buffer(int64_t n) : v_(size_t(n)) {}
    T* data() { return v_.data(); }
    const T* data() const { return v_.data(); }
    int64_t size() const { return int64_t(v_.size()); }

   private:
    std::vector<T> v_;
  };

  template <class T>
  Buffer<T> alloc(int64_t n) {
    return Buffer<T>(n);
  }
  template <class T>
  void upload(Buffer<T>& dst, const T* src, int64_t n) {
    if (n > 0) std::memcpy(dst.data(), src, size_t(n) * sizeof(T));
  }
  template <class T>
  void download(const Buffer<T>& src, T* dst, int64_t n) const {
    if (n > 0) std::memcpy(dst, src.data(), size_t(n) * sizeof(T));
  }
  template <class Body>
  void launch(int64_t n, const Body& body) {
    // Threads of a kernel body never depend on one another (the CUDA
    // contract: one thread per output element, no ordering between
    // threads), so the loop may be vectorized; +, -, *, / and sqrt round
    // the same in vector lanes, so the bits do not change.
    // (clang has no ivdep; its forced vectorization warns wherever it
    // cannot vectorize, e.g. under sanitizers, so it is left to decide.)
#if !defined(__clang__)
#pragma GCC ivdep
#endif
    for (int64_t i = 0; i < n; ++i) body(i);
  }
  // The matrix product: the same sums as kern::MatMul's threads, each in
  // its order, computed a block of outputs at a time (vectorized across
  // outputs).  n must be mm.m * mm.n (std::invalid_argument otherwise).
  void launch(int64_t n, const kern::MatMul& mm);
  void synchronize() {}
  // "emulated executor: kernel bodies on the CPU, 1 thread"
  std::string describe() const;

 private:
  std::vector<float> packed_;  // op(B) laid out k x n, when tb
};

static_assert(Executor<EmulatedExecutor>);

extern template class Device<EmulatedExecutor>;
using EmulatedDevice = Device<EmulatedExecutor>;
static_assert(Engine<EmulatedDevice>);
// The trainer on this engine is compiled once, in gpu/emulated.cpp, at the
// library's optimization (docs/development.md "Build").
extern template class Trainer<EmulatedDevice>;

// The SHA-256 of gpu/kernels.hpp this library was compiled against
// (computed by CMake; tests compare it with the CUDA library's).
const char* emulated_kernel_source_digest();

namespace emulated_detail {
// The emulated matrix product's vector path: "avx512", "avx2" or
// "generic".  Every path computes the same bits (each output's sum as
// kern::MatMul writes it); the widest this CPU runs is used unless the
// environment variable ACCUMCHECK_MATMUL_PATH names another, so that tests
// can compare them.
std::string matmul_path();
// The paths this CPU can run.
std::vector<std::string> matmul_paths();
// Switches the path (std::invalid_argument for a name that is not one or
// that this CPU cannot run).
void use_matmul_path(const std::string& name);
}  // namespace emulated_detail

}  // namespace accumcheck
