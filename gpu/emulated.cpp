#include "gpu/emulated.hpp"

#include <cblas.h>

#include <limits>
#include <stdexcept>

#include "gpu/device_impl.hpp"

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

// OpenBLAS's pthreads build starts a server thread per core when it is
// loaded, and each spins (sched_yield) for about 2^28 cycles waiting for
// work before it sleeps: about 0.1 s of CPU per extra core in every
// process, whether it calls BLAS or not (half of certify's CPU time on a
// small trace).  accumcheck runs its own threads and calls BLAS on one, so
// the library is set to one thread and its servers are stopped when this
// file's code is loaded (after the library's own constructor).
// blas_thread_shutdown_ is OpenBLAS's exported stop (it restarts the
// servers itself if a threaded call ever comes); weak, as builds without
// threads do not have it.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

const bool blas_threads_released = [] {
  openblas_set_num_threads(1);
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
  return true;
}();

}  // namespace

EmulatedExecutor::EmulatedExecutor() { (void)blas_threads_released; }

void EmulatedExecutor::gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float* a, int64_t lda,
                            const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, to_blas(ta), to_blas(tb), to_blas(m), to_blas(n),
              to_blas(k), alpha, a, to_blas(lda), b, to_blas(ldb), beta, c,
              to_blas(ldc));
}

std::string EmulatedExecutor::describe() const {
  std::string s = "emulated executor: ";
  s += openblas_get_config();
  s += " (core ";
  s += openblas_get_corename();
  s += "), " + std::to_string(openblas_get_num_threads()) + " thread(s)";
  return s;
}

const char* emulated_kernel_source_digest() {
  return kern::kKernelSourceDigest;
}

template class Device<EmulatedExecutor>;

}  // namespace accumcheck
