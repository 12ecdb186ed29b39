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
//       concurrently: bodies (gpu/kernels.hpp) never share an output.
//       Every computation is a body, the matrix product included
//       (kern::MatMul): an executor may run a body's threads in another
//       arrangement (several outputs at once, vectorized) only where each
//       output gets exactly the operations the body writes, in its order.
//   std::string describe() const     one line for a trace header
#pragma once

#include <concepts>
#include <cstdint>
#include <string>

#include "gpu/kernels.hpp"

namespace accumcheck {

template <class X>
concept Executor = requires(X x, const X cx, int64_t n) {
  typename X::template Buffer<float>;
  {
    x.template alloc<float>(n)
    } -> std::same_as<typename X::template Buffer<float>>;
  {x.launch(n, kern::MatMul{})};
  { cx.describe() } -> std::convertible_to<std::string>;
};

}  // namespace accumcheck
