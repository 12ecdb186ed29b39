// parallel_for: fn(i) for every i in [0, n) on up to `threads` threads
// (0: every core), each index run exactly once.  Callers store results by
// index, so what they compute never depends on the thread count or the
// schedule; an exception from fn is rethrown after every thread has
// joined (the lowest index's, so that too is independent of scheduling).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

#include "oracle/real.hpp"

namespace accumcheck {

inline unsigned thread_count(int threads) {
  if (threads > 0) return unsigned(threads);
  return std::max(1u, std::thread::hardware_concurrency());
}

template <class F>
void parallel_for(size_t n, int threads, F&& fn) {
  const size_t T = std::min<size_t>(thread_count(threads), n);
  if (T <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(n);
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  // Each worker frees MPFR's per-thread caches when it ends (the
  // sanitizer build's LeakSanitizer sees them otherwise).
  for (size_t t = 1; t < T; ++t)
    pool.emplace_back([&] {
      ThreadCacheRelease release;  // oracle/real.hpp
      work();
    });
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace accumcheck
