#include "gpu/emulated.hpp"

#include <cblas.h>

#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "gpu/device_impl.hpp"
#include "gpu/shared_library.hpp"

namespace accumcheck {

namespace {

blasint to_blas(int64_t v) {
  if (v < 0 || v > std::numeric_limits<blasint>::max())
    throw std::length_error("EmulatedExecutor::gemm: dimension " +
                            std::to_string(v) + " out of BLAS range");
  return blasint(v);
}

CBLAS_TRANSPOSE to_blas(Trans t) {
  return t == Trans::yes ? CblasTrans : CblasNoTrans;
}

// OpenBLAS is loaded with dlopen when the first EmulatedExecutor is made,
// not linked: a process that links it maps and relocates 36 MB of library
// and starts a server thread per core, each spinning (sched_yield) for
// about 2^28 cycles waiting for work before it sleeps -- about 7 ms of CPU
// at every start of every accumcheck command and test process, and 0.1 s
// more per extra core in any that lives that long, whether it calls BLAS
// or not (`certify`, the oracle, the contract tier never do; on a small
// trace the threads were half of certify's CPU time).  accumcheck runs its
// own threads and calls BLAS on one, so the library is set to one thread
// and its servers are stopped (blas_thread_shutdown_, OpenBLAS's exported
// stop; absent from builds without threads) as soon as it is loaded.
// cblas.h still declares every function, so each pointer has the exact
// type of the function it names.
#define ACCUMCHECK_OPENBLAS_FUNCTIONS(X) \
  X(cblas_sgemm)                         \
  X(openblas_set_num_threads)            \
  X(openblas_get_num_threads) X(openblas_get_config) X(openblas_get_corename)

ACCUMCHECK_LIBRARY_API(BlasApi, ACCUMCHECK_OPENBLAS_FUNCTIONS);

// libopenblas.so.0 looked up the way the linker would (ld.so.cache: the
// system's chosen OpenBLAS), then in the folder pkg-config named at
// configure time.
const BlasApi& blas() {
  static BlasApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libopenblas.so.0";
    void* lib = gpu_detail::load_library(
        api, soname, ACCUMCHECK_OPENBLAS_LIBRARY_DIR, [&](void* lib) {
          ACCUMCHECK_OPENBLAS_FUNCTIONS(ACCUMCHECK_LIBRARY_RESOLVE)
        });
    if (!lib) return;
    api.openblas_set_num_threads(1);
    using Shutdown = int (*)();
    if (auto stop =
            reinterpret_cast<Shutdown>(dlsym(lib, "blas_thread_shutdown_")))
      stop();
  });
  return api;
}

}  // namespace

EmulatedExecutor::EmulatedExecutor() {
  if (!blas().error.empty())
    throw std::runtime_error("emulated executor: OpenBLAS: " + blas().error);
}

void EmulatedExecutor::gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float* a, int64_t lda,
                            const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc) {
  if (m == 0 || n == 0) return;
  blas().cblas_sgemm(CblasRowMajor, to_blas(ta), to_blas(tb), to_blas(m),
                     to_blas(n), to_blas(k), alpha, a, to_blas(lda), b,
                     to_blas(ldb), beta, c, to_blas(ldc));
}

std::string EmulatedExecutor::describe() const {
  std::string s = "emulated executor: ";
  s += blas().openblas_get_config();
  s += " (core ";
  s += blas().openblas_get_corename();
  s += "), " + std::to_string(blas().openblas_get_num_threads()) + " thread(s)";
  return s;
}

const char* emulated_kernel_source_digest() {
  return kern::kKernelSourceDigest;
}

template class Device<EmulatedExecutor>;

}  // namespace accumcheck
