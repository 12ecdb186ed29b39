#include "gpu/emulated.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "gpu/device_impl.hpp"
#include "sim/errors.hpp"

namespace accumcheck {

namespace {

// The emulated matrix product.  kern::MatMul's thread (i, j) forms
//   s = 0;  s = fmaf(op(A)[i, p], op(B)[p, j], s)  for p = 0, 1, ..., k-1.
// Here many outputs are formed at once, each with exactly those steps: a
// block of R rows by V columns of sums is kept in registers while p runs
// from 0 to k-1, and the V columns (independent outputs) are what
// vectorizes.  Nothing is reordered within one output's sum, so the bits
// are the thread's.
//
// The loop wants the operand it vectorizes over contiguous (Core's Y: row
// p holds the columns side by side).  The product is computed either
// as C = op(A) op(B) (vectorized over C's columns j; op(B) must be
// k rows of n) or as C^T = op(B)^T op(A)^T (vectorized over C's rows i;
// op(A)^T must be k rows of m), whichever needs the smaller transposed
// copy (a copy changes no value; fmaf(x, y, s) = fmaf(y, x, s)).
struct Core {
  const float* a;  // X(r, p) = a[r * ar + p * ap]: the broadcast operand
  int64_t ar, ap;
  const float* b;  // Y(p, v) = b[p * ldb + v]: the vectorized operand
  int64_t ldb;
  float* c;  // out(r, v) = c[r * cr + v * cv]
  int64_t cr, cv;
  int64_t rows, cols, k;
};

// The portable block: R x V sums, each one fmaf per p.  (GCC does not keep
// these in vector registers by itself; the x86 blocks below do.)
template <int R, int V>
void block_generic(const Core& x, int64_t r0, int64_t v0) {
  float acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = 0.0f;
  const float* ap = x.a + r0 * x.ar;
  const float* bp = x.b + v0;
  for (int64_t p = 0; p < x.k; ++p, ap += x.ap, bp += x.ldb)
    for (int r = 0; r < R; ++r) {
      const float av = ap[r * x.ar];
      for (int v = 0; v < V; ++v) acc[r][v] = dm::fma(av, bp[v], acc[r][v]);
    }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      x.c[(r0 + r) * x.cr + (v0 + v) * x.cv] = acc[r][v];
}

#if defined(__x86_64__)
// The same sums with the vector FMA instructions: lane v of
// _mm512_fmadd_ps(a, b, s) is fmaf(a_v, b_v, s_v), one rounding, IEEE (no
// flush to zero: the process keeps MXCSR's default).  2 vectors of 16
// (AVX-512) or of 8 (AVX2) columns by R rows.  The loops over r are
// unrolled (GCC kept AVX2's acc array in memory as well as in registers
// and stored all 12 sums at every p: half the speed).
template <int R>
__attribute__((target("avx512f"))) void block_avx512(const Core& x, int64_t r0,
                                                     int64_t v0) {
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* ap = x.a + r0 * x.ar;
  const float* bp = x.b + v0;
  for (int64_t p = 0; p < x.k; ++p, ap += x.ap, bp += x.ldb) {
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * x.ar]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  if (x.cv == 1) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* c = x.c + (r0 + r) * x.cr + v0;
      _mm512_storeu_ps(c, acc[r][0]);
      _mm512_storeu_ps(c + 16, acc[r][1]);
    }
    return;
  }
  alignas(64) float out[32];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(out, acc[r][0]);
    _mm512_store_ps(out + 16, acc[r][1]);
    for (int v = 0; v < 32; ++v)
      x.c[(r0 + r) * x.cr + (v0 + v) * x.cv] = out[v];
  }
}

template <int R>
__attribute__((target("avx2,fma"))) void block_avx2(const Core& x, int64_t r0,
                                                    int64_t v0) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* ap = x.a + r0 * x.ar;
  const float* bp = x.b + v0;
  for (int64_t p = 0; p < x.k; ++p, ap += x.ap, bp += x.ldb) {
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ap + r * x.ar);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  if (x.cv == 1) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* c = x.c + (r0 + r) * x.cr + v0;
      _mm256_storeu_ps(c, acc[r][0]);
      _mm256_storeu_ps(c + 8, acc[r][1]);
    }
    return;
  }
  alignas(32) float out[16];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, acc[r][0]);
    _mm256_store_ps(out + 8, acc[r][1]);
    for (int v = 0; v < 16; ++v)
      x.c[(r0 + r) * x.cr + (v0 + v) * x.cv] = out[v];
  }
}
#endif

// Columns [v0, cols) of rows [r0, r0 + R): scalar sums, R of them at a
// time so that their fmaf chains overlap, each still p = 0, 1, ..., k-1.
template <int R>
void tail(const Core& x, int64_t r0, int64_t v0) {
  for (int64_t v = v0; v < x.cols; ++v) {
    float acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    const float* ap = x.a + r0 * x.ar;
    for (int64_t p = 0; p < x.k; ++p, ap += x.ap) {
      const float b = x.b[p * x.ldb + v];
      for (int r = 0; r < R; ++r) acc[r] = dm::fma(ap[r * x.ar], b, acc[r]);
    }
    for (int r = 0; r < R; ++r) x.c[(r0 + r) * x.cr + v * x.cv] = acc[r];
  }
}

// The vector path (a choice of speed only: every path computes the same
// bits): the widest this CPU runs, or the one ACCUMCHECK_MATMUL_PATH names
// (read at the first product; tests compare the paths).
enum class Isa { generic, avx2, avx512 };
constexpr const char* kIsaNames[] = {"generic", "avx2", "avx512"};

bool supported(Isa i) {
#if defined(__x86_64__)
  if (i == Isa::avx512) return __builtin_cpu_supports("avx512f");
  if (i == Isa::avx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return true;
#else
  return i == Isa::generic;
#endif
}

Isa parse_isa(const std::string& name) {
  for (int i = 0; i < 3; ++i)
    if (name == kIsaNames[i]) {
      if (!supported(Isa(i)))
        throw InputError("", 0, 0, "ACCUMCHECK_MATMUL_PATH",
                         "'" + name + "': this CPU cannot run that path");
      return Isa(i);
    }
  throw InputError("", 0, 0, "ACCUMCHECK_MATMUL_PATH",
                   "'" + name + "': expected one of generic, avx2, avx512");
}

std::atomic<int> chosen{-1};

Isa isa() {
  int c = chosen.load(std::memory_order_relaxed);
  if (c < 0) {
    Isa best = Isa::generic;
    for (Isa i : {Isa::avx2, Isa::avx512})
      if (supported(i)) best = i;
    if (const char* env = std::getenv("ACCUMCHECK_MATMUL_PATH"); env && *env)
      best = parse_isa(env);
    c = int(best);
    chosen.store(c, std::memory_order_relaxed);
  }
  return Isa(c);
}

int64_t width(Isa i) { return i == Isa::avx512 ? 32 : 16; }

// The most rows a block holds in registers: AVX-512's 32 vector registers
// hold 8 x 2 sums of 16, AVX2's 16 hold 6 x 2 sums of 8 (and the two
// vectors of B and a broadcast).
int max_rows(Isa i) { return i == Isa::avx512 ? 8 : i == Isa::avx2 ? 6 : 4; }

template <int R>
void block(Isa i, const Core& x, int64_t r0, int64_t v0) {
#if defined(__x86_64__)
  if (i == Isa::avx512) return block_avx512<R>(x, r0, v0);
  if (i == Isa::avx2) return block_avx2<R>(x, r0, v0);
#endif
  block_generic<R, 16>(x, r0, v0);
}

void block_of(int rows, Isa i, const Core& x, int64_t r0, int64_t v0) {
  switch (rows) {
    case 8:
      return block<8>(i, x, r0, v0);
    case 7:
      return block<7>(i, x, r0, v0);
    case 6:
      return block<6>(i, x, r0, v0);
    case 5:
      return block<5>(i, x, r0, v0);
    case 4:
      return block<4>(i, x, r0, v0);
    case 3:
      return block<3>(i, x, r0, v0);
    case 2:
      return block<2>(i, x, r0, v0);
    default:
      return block<1>(i, x, r0, v0);
  }
}

// Y's packed columns: at most this many floats (512 KiB, a quarter of a
// 2 MiB L2).
constexpr int64_t kPackedY = int64_t(1) << 17;

// The blocks read both operands from contiguous copies (copies change no
// value, so no bit).  Unpacked, a panel of V columns of Y over k rows is
// k lines ldb floats apart, and with ldb a multiple of 1024 (4 KiB) all of
// them fall in one L1 set, so every block of rows fetched them again from
// beyond L1 (the input gradient 32 x 4096 x 1024, whose Y is a 1024 x 4096
// weight, is the case; development.md has its times).  Packed:
//  - Y's panels of columns [v0, v0 + V): k rows of V each, shared by every
//    block of rows;
//  - X, where its p runs with a stride (ap != 1): block by block, each
//    block's R rows side by side for each p (k rows of R), once.
// The rows go in blocks of at most max_rows, as even as they can be (32
// rows in AVX2's blocks of 6: 6, 6, 5, 5, 5, 5, not 6 x 5 + 1 + 1, whose
// one-row blocks wait on one FMA chain per vector).
void run(const Core& x) {
  const Isa i = isa();
  const int64_t V = width(i);
  const int64_t full = x.cols - x.cols % V;
  const int64_t nb = (x.rows + max_rows(i) - 1) / max_rows(i);
  auto rows_of = [&](int64_t b) {  // block b's first row and its rows
    const int64_t base = x.rows / nb, extra = x.rows % nb;
    return std::pair<int64_t, int>(b * base + std::min(b, extra),
                                   int(base + (b < extra)));
  };
  thread_local std::vector<float> xpack, ypack;
  const bool pack_x = full > 0 && x.ap != 1 && x.k > 1;
  if (pack_x) {
    xpack.resize(size_t(x.rows * x.k));
    for (int64_t b = 0; b < nb; ++b) {
      const auto [r0, R] = rows_of(b);
      float* dst = xpack.data() + r0 * x.k;
      for (int64_t p = 0; p < x.k; ++p)
        for (int r = 0; r < R; ++r)
          dst[p * R + r] = x.a[(r0 + r) * x.ar + p * x.ap];
    }
  }
  // A block's sums for columns [v0, v0 + V) of its rows, from Y's rows at
  // `y` (V apart when packed, ldb apart when not).
  auto one = [&](int64_t b, int64_t v0, const float* y, int64_t ldy) {
    const auto [r0, R] = rows_of(b);
    Core z = x;
    if (pack_x) {
      z.a = xpack.data() + r0 * x.k;
      z.ar = 1;
      z.ap = R;
    } else {
      z.a = x.a + r0 * x.ar;
    }
    z.b = y;
    z.ldb = ldy;
    z.c = x.c + r0 * x.cr + v0 * x.cv;
    block_of(R, i, z, 0, 0);
  };
  if (nb == 1) {
    for (int64_t v0 = 0; v0 < full; v0 += V) one(0, v0, x.b + v0, x.ldb);
  } else {
    // Y packed panel after panel (k rows of V each), as many columns at a
    // time as kPackedY floats hold (all of them, when they fit); then
    // each block of rows over every panel of the chunk: its X stays in
    // L1 and its C is written along its rows.
    const int64_t nc =
        x.k * full <= kPackedY
            ? full
            : std::max(V, kPackedY / std::max<int64_t>(x.k, 1) / V * V);
    ypack.resize(size_t(x.k * std::min(nc, full)));
    for (int64_t c0 = 0; c0 < full; c0 += nc) {
      const int64_t c1 = std::min(full, c0 + nc);
      for (int64_t p = 0; p < x.k; ++p)
        for (int64_t v0 = c0; v0 < c1; v0 += V)
          std::copy_n(x.b + p * x.ldb + v0, V,
                      ypack.data() + (v0 - c0) * x.k + p * V);
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t v0 = c0; v0 < c1; v0 += V)
          one(b, v0, ypack.data() + (v0 - c0) * x.k, V);
    }
  }
  if (full < x.cols) {
    int64_t r0 = 0;
    for (; r0 + 8 <= x.rows; r0 += 8) tail<8>(x, r0, full);
    for (; r0 < x.rows; ++r0) tail<1>(x, r0, full);
  }
}

// A rough cost in cycles, only to choose an orientation (the bits are the
// same either way): a vectorized term 1/V, a scalar (tail) term 1, a
// copied element 2.
int64_t cost(int64_t rows, int64_t cols, int64_t k, int64_t copied) {
  const int64_t V = width(isa()), full = cols - cols % V;
  return 2 * copied + k * rows * (full / V + (cols - full));
}

}  // namespace

void EmulatedExecutor::launch(int64_t n, const kern::MatMul& mm) {
  if (mm.m < 0 || mm.n < 0 || mm.k < 0 || n != mm.m * mm.n)
    throw std::invalid_argument("EmulatedExecutor: MatMul launched over " +
                                std::to_string(n) + " threads for a " +
                                std::to_string(mm.m) + " x " +
                                std::to_string(mm.n) + " product");
  if (n == 0) return;
  const int64_t m = mm.m, cols = mm.n, k = mm.k;
  // Copies `rows` x `k` elements at(r, p) into packed_ as k rows of `rows`.
  // (In 16 x 16 tiles, so that reads and writes both stay in cache.)
  auto pack = [&](int64_t rows, auto at) {
    packed_.resize(size_t(k * rows));
    constexpr int64_t kTile = 16;
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t p0 = 0; p0 < k; p0 += kTile)
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
          for (int64_t p = p0; p < std::min(k, p0 + kTile); ++p)
            packed_[size_t(p * rows + r)] = at(r, p);
    return packed_.data();
  };
  const bool by_cols = cost(m, cols, k, mm.tb ? k * cols : 0) <=
                       cost(cols, m, k, mm.ta ? 0 : m * k);
  Core x{};
  x.k = k;
  if (by_cols) {  // C = op(A) op(B), vectorized over j
    x.a = mm.a;
    x.ar = mm.ta ? 1 : mm.lda;
    x.ap = mm.ta ? mm.lda : 1;
    x.b = mm.tb
              ? pack(cols, [&](int64_t j, int64_t p) { return mm.b_at(p, j); })
              : mm.b;
    x.ldb = mm.tb ? cols : mm.ldb;
    x.c = mm.c;
    x.cr = mm.ldc;
    x.cv = 1;
    x.rows = m;
    x.cols = cols;
  } else {  // C^T = op(B)^T op(A)^T, vectorized over i
    x.a = mm.b;
    x.ar = mm.tb ? mm.ldb : 1;
    x.ap = mm.tb ? 1 : mm.ldb;
    x.b = mm.ta ? mm.a
                : pack(m, [&](int64_t i, int64_t p) { return mm.a_at(i, p); });
    x.ldb = mm.ta ? mm.lda : m;
    x.c = mm.c;
    x.cr = 1;
    x.cv = mm.ldc;
    x.rows = cols;
    x.cols = m;
  }
  run(x);
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

namespace emulated_detail {

std::string matmul_path() { return kIsaNames[int(isa())]; }

std::vector<std::string> matmul_paths() {
  std::vector<std::string> out;
  for (int i = 0; i < 3; ++i)
    if (supported(Isa(i))) out.push_back(kIsaNames[i]);
  return out;
}

void use_matmul_path(const std::string& name) {
  chosen.store(int(parse_isa(name)), std::memory_order_relaxed);
}

}  // namespace emulated_detail

template class Device<EmulatedExecutor>;
template class Trainer<EmulatedDevice>;

}  // namespace accumcheck
