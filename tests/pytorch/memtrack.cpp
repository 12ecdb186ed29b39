// memtrack: an LD_PRELOAD shim that counts the bytes PyTorch's CPU
// allocator holds, for tests/pytorch/memory_check.py.
//
// c10's CPU allocator (c10/core/impl/alloc_cpu.cpp, PyTorch 1.13) takes
// every tensor storage from posix_memalign with 64-byte alignment and
// returns it with free().  The shim records those blocks (pointer ->
// requested bytes) while tracking is on and keeps the live total and its
// peak; other allocations (Python objects, BLAS buffers) pass through
// uncounted.  Read through ctypes: memtrack_enable, memtrack_live,
// memtrack_peak, memtrack_reset_peak.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {
using MemalignFn = int (*)(void**, size_t, size_t);
using FreeFn = void (*)(void*);
std::mutex mu;
std::unordered_map<void*, size_t>* blocks = nullptr;
size_t live = 0, peak = 0;
bool enabled = false;
thread_local bool inside = false;  // the map's own malloc/free pass through

FreeFn real_free() {
  static FreeFn f = reinterpret_cast<FreeFn>(dlsym(RTLD_NEXT, "free"));
  return f;
}
}  // namespace

extern "C" {

int posix_memalign(void** out, size_t alignment, size_t n) {
  static MemalignFn real =
      reinterpret_cast<MemalignFn>(dlsym(RTLD_NEXT, "posix_memalign"));
  const int rc = real(out, alignment, n);
  if (rc != 0 || alignment != 64 || inside) return rc;
  std::lock_guard<std::mutex> lock(mu);
  if (!enabled) return rc;
  inside = true;
  if (!blocks) blocks = new std::unordered_map<void*, size_t>();
  (*blocks)[*out] = n;
  inside = false;
  live += n;
  if (live > peak) peak = live;
  return rc;
}

void free(void* p) {
  if (p && !inside) {
    std::lock_guard<std::mutex> lock(mu);
    if (blocks) {
      inside = true;
      const auto it = blocks->find(p);
      if (it != blocks->end()) {
        live -= it->second;
        blocks->erase(it);
      }
      inside = false;
    }
  }
  real_free()(p);
}

void memtrack_enable(int on) {
  std::lock_guard<std::mutex> lock(mu);
  enabled = on != 0;
}
uint64_t memtrack_live() {
  std::lock_guard<std::mutex> lock(mu);
  return live;
}
uint64_t memtrack_peak() {
  std::lock_guard<std::mutex> lock(mu);
  return peak;
}
void memtrack_reset_peak() {
  std::lock_guard<std::mutex> lock(mu);
  peak = live;
}
}
