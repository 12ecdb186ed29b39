#include "gpu/emulated.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "gpu/device_impl.hpp"

namespace accumcheck {

namespace {

// The product is computed kRows rows of C by kCols columns at a time: each
// op(B) row segment, loaded once, serves kRows rows, and the kRows x kCols
// partial sums stay in the L1 cache.  Within a block, p runs 0, 1, ..., k-1
// for every output and each step is one fmaf, so every output is exactly
// the sum kern::MatMul's thread forms; the loop over j (independent
// outputs) is what vectorizes.
constexpr int64_t kRows = 4, kCols = 256;

}  // namespace

void EmulatedExecutor::launch(int64_t n, const kern::MatMul& mm) {
  if (mm.m < 0 || mm.n < 0 || mm.k < 0 || n != mm.m * mm.n)
    throw std::invalid_argument("EmulatedExecutor: MatMul launched over " +
                                std::to_string(n) + " threads for a " +
                                std::to_string(mm.m) + " x " +
                                std::to_string(mm.n) + " product");
  if (n == 0) return;
  const int64_t m = mm.m, cols = mm.n, k = mm.k;
  // op(B) as k rows of `cols` contiguous floats: B itself, or its
  // transpose copied (a copy changes no value).
  const float* b = mm.b;
  int64_t ldb = mm.ldb;
  if (mm.tb) {
    packed_.resize(size_t(k * cols));
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t p = 0; p < k; ++p)
        packed_[size_t(p * cols + j)] = mm.b[j * mm.ldb + p];
    b = packed_.data();
    ldb = cols;
  }
  alignas(64) float acc[kRows][kCols];
  for (int64_t i0 = 0; i0 < m; i0 += kRows) {
    const int64_t rows = std::min(kRows, m - i0);
    for (int64_t j0 = 0; j0 < cols; j0 += kCols) {
      const int64_t w = std::min(kCols, cols - j0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < w; ++j) acc[r][j] = 0.0f;
      for (int64_t p = 0; p < k; ++p) {
        const float* brow = b + p * ldb + j0;
        if (rows == kRows) {
          const float a0 = mm.a_at(i0, p), a1 = mm.a_at(i0 + 1, p),
                      a2 = mm.a_at(i0 + 2, p), a3 = mm.a_at(i0 + 3, p);
          for (int64_t j = 0; j < w; ++j) {
            const float bj = brow[j];
            acc[0][j] = dm::fma(a0, bj, acc[0][j]);
            acc[1][j] = dm::fma(a1, bj, acc[1][j]);
            acc[2][j] = dm::fma(a2, bj, acc[2][j]);
            acc[3][j] = dm::fma(a3, bj, acc[3][j]);
          }
        } else {
          for (int64_t r = 0; r < rows; ++r) {
            const float ar = mm.a_at(i0 + r, p);
            for (int64_t j = 0; j < w; ++j)
              acc[r][j] = dm::fma(ar, brow[j], acc[r][j]);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        std::copy(acc[r], acc[r] + w, mm.c + (i0 + r) * mm.ldc + j0);
    }
  }
}

std::string EmulatedExecutor::describe() const {
  return std::string(
             "emulated executor: kernel bodies on the CPU, 1 thread "
             "(gpu/kernels.hpp sha256 ") +
         std::string(kern::kKernelSourceDigest).substr(0, 16) + ")";
}

const char* emulated_kernel_source_digest() {
  return kern::kKernelSourceDigest;
}

template class Device<EmulatedExecutor>;

}  // namespace accumcheck
