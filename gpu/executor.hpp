// What Device<Executor> (gpu/device.hpp) asks of an executor.
//
// An executor owns a memory space and runs work in it, in issue order (one
// stream):
//   template <class T> class Buffer        movable, owns n elements of T
//     T* data(); const T* data() const; int64_t size() const;
//   template <class T> Buffer<T> alloc(int64_t n)       zero-filled
//   template <class T> void upload(Buffer<T>&, const T* host, int64_t n)
//   template <class T> void download(const Buffer<T>&, T* host, int64_t n)
//                                                 (blocks until done)
//   template <class Body> void launch(int64_t n, const Body& body)
//       runs body(i) for every i in [0, n), each i once, in any order or
//       concurrently: bodies (gpu/kernels.hpp) never share an output
//   void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k,
//             float alpha, const float* a, int64_t lda, const float* b,
//             int64_t ldb, float beta, float* c, int64_t ldc)
//       row-major C[m x n] = alpha * op(A)[m x k] op(B)[k x n] + beta * C
//       (BLAS semantics: beta = 0 ignores C's old contents, NaN included)
//   std::string describe() const     one line for a trace header
#pragma once

#include <concepts>
#include <cstdint>
#include <string>

namespace accumcheck {

enum class Trans { no, yes };

template <class X>
concept Executor = requires(X x, const X cx, int64_t n, float* p,
                            const float* cp) {
  typename X::template Buffer<float>;
  {
    x.template alloc<float>(n)
    } -> std::same_as<typename X::template Buffer<float>>;
  {x.gemm(Trans::no, Trans::no, n, n, n, 1.0f, cp, n, cp, n, 0.0f, p, n)};
  { cx.describe() } -> std::convertible_to<std::string>;
};

}  // namespace accumcheck
