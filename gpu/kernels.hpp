// Kernel bodies of the float32 engine, shared by every executor.
//
// Each kernel is a small struct of raw pointers and sizes whose
// operator()(i) computes output element(s) i: one thread per output
// element, every reduction inside a thread in a fixed order, no atomics,
// no shared state between threads.  The emulated executor runs
// `for (i = 0; i < n; ++i) body(i)`; the CUDA executor launches the very
// same struct through one generic __global__ function.  All arithmetic is
// single IEEE float operations or explicit fmaf (gpu/device_math.hpp), so
// both executors compute identical bits.  The oracle implements the same
// kernel names in exact arithmetic.
//
// Grid sizes (the n to launch with) are documented on each kernel as
// "threads:"; tests/device_kernels_test.cpp checks that each kernel,
// launched over exactly that grid, writes every output element once and
// nothing outside its buffers.
#pragma once

#include <cstdint>

#include "gpu/device_math.hpp"

namespace accumcheck::kern {

// The SHA-256 of this file, passed in by gpu/CMakeLists.txt to every
// library that compiles these bodies ("unknown" elsewhere).
#ifdef ACCUMCHECK_KERNELS_SHA256
inline constexpr const char* kKernelSourceDigest = ACCUMCHECK_KERNELS_SHA256;
#else
inline constexpr const char* kKernelSourceDigest = "unknown";
#endif

// Activation codes (sim/scenario.hpp Activation, in the same order).
enum class Act : int32_t { identity = 0, tanh = 1, relu = 2, gelu = 3 };

// f(z).  gelu is the exact erf form z * (1 + erf(z / sqrt 2)) / 2.
ACCUMCHECK_HD inline float activation(Act act, float z) {
  switch (act) {
    case Act::identity:
      return z;
    case Act::tanh:
      return dm::ac_tanhf(z);
    case Act::relu:
      return z > 0.0f ? z : 0.0f;
    case Act::gelu: {
      const float kInvSqrt2 = 0.707106781186547524f;
      return z * (1.0f + dm::ac_erff(z * kInvSqrt2)) * 0.5f;
    }
  }
  return z;
}

// f'(z), given z and a = f(z).
//   tanh: 1 - a^2 (a is tanh(z), the same bits the forward stored)
//   relu: 1 for z > 0, else 0 (PyTorch's threshold_backward)
//   gelu: Phi(z) + z * phi(z) = (1 + erf(z/sqrt2))/2 + z exp(-z^2/2)/sqrt(2pi)
ACCUMCHECK_HD inline float activation_derivative(Act act, float z, float a) {
  switch (act) {
    case Act::identity:
      return 1.0f;
    case Act::tanh:
      return 1.0f - a * a;
    case Act::relu:
      return z > 0.0f ? 1.0f : 0.0f;
    case Act::gelu: {
      const float kInvSqrt2 = 0.707106781186547524f;
      const float kInvSqrt2Pi = 0.398942280401432678f;
      const float cdf = (1.0f + dm::ac_erff(z * kInvSqrt2)) * 0.5f;
      const float pdf = dm::ac_expf(-0.5f * (z * z)) * kInvSqrt2Pi;
      return cdf + z * pdf;
    }
  }
  return 1.0f;
}

// The matrix product, row-major:
//   c[i * ldc + j] = sum_{p = 0}^{k-1} op(A)[i, p] * op(B)[p, j]   (set)
//   op(A)[i, p] = ta ? a[p * lda + i] : a[i * lda + p]          (m x k)
//   op(B)[p, j] = tb ? b[j * ldb + p] : b[p * ldb + j]          (k x n)
// One thread per output element (i, j) = (t / n, t % n); its sum is formed
// in the one order written here, with one rounding per term:
//   s = 0;  for p = 0, 1, ..., k-1:  s = fmaf(op(A)[i, p], op(B)[p, j], s)
//   c = s                               (k = 0: c = 0)
// No BLAS: the order, and so every bit, is the same on every CPU and GPU
// (a BLAS picks its blocking and summation order by the machine).  An
// executor may run the threads in any arrangement (the emulated one
// computes many outputs at once, gpu/emulated.cpp) as long as each output
// is this sum in this order.  threads: m * n.
struct MatMul {
  const float* a;
  const float* b;
  float* c;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;
  bool ta, tb;
  ACCUMCHECK_HD float a_at(int64_t i, int64_t p) const {
    return ta ? a[p * lda + i] : a[i * lda + p];
  }
  ACCUMCHECK_HD float b_at(int64_t p, int64_t j) const {
    return tb ? b[j * ldb + p] : b[p * ldb + j];
  }
  ACCUMCHECK_HD void operator()(int64_t t) const {
    const int64_t i = t / n, j = t - i * n;
    float s = 0.0f;
    for (int64_t p = 0; p < k; ++p) s = dm::fma(a_at(i, p), b_at(p, j), s);
    c[i * ldc + j] = s;
  }
};

// dst[r, c] = src[ids[r], c]: gathers a micro-batch's rows.
// threads: rows * cols.
template <class T>
struct GatherRows {
  const T* src;
  const int64_t* ids;
  T* dst;
  int64_t cols;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const int64_t r = i / cols, c = i - r * cols;
    dst[i] = src[ids[r] * cols + c];
  }
};

// z[r, c] = z[r, c] + bias[c]  (z holds X W^T on entry: set)
// a[r, c] = f(z[r, c])                                   (set)
// threads: rows * cols.
struct BiasActivationForward {
  float* z;
  const float* bias;
  float* a;
  int64_t cols;
  Act act;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const float v = z[i] + bias[i % cols];
    z[i] = v;
    a[i] = activation(act, v);
  }
};

// dz = da * f'(z)   (set).  threads: rows * cols.
struct ActivationBackward {
  const float* da;
  const float* z;
  const float* a;
  float* dz;
  Act act;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    dz[i] = da[i] * activation_derivative(act, z[i], a[i]);
  }
};

// dbias[c] += sum_r dz[r, c], the sum over r = 0, 1, ... taken first and
// then added once (so a second identical backward doubles it exactly).
// threads: cols.
struct BiasGradColSum {
  const float* dz;
  float* dbias;
  int64_t rows, cols;
  ACCUMCHECK_HD void operator()(int64_t c) const {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; ++r) s = s + dz[r * cols + c];
    dbias[c] = dbias[c] + s;
  }
};

// out = f(in)   (set).  threads: n.
struct ActivationForward {
  const float* in;
  float* out;
  Act act;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    out[i] = activation(act, in[i]);
  }
};

// nn.Dropout (training): out = keep ? in * scale : 0, scale =
// float(1 / (1 - p)), keep a host-computed mask keyed by (seed, epoch,
// sample id, layer, unit).  The backward is the same kernel on the
// gradient.  threads: n.
struct Dropout {
  const float* in;
  const int32_t* keep;
  float* out;
  float scale;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    out[i] = keep[i] ? in[i] * scale : 0.0f;
  }
};

// BatchNorm1d / LayerNorm / GroupNorm statistics, one thread per group g
// (a feature over the rows for BatchNorm, a row over its features for
// LayerNorm, a row's ng-th for GroupNorm(ng); element k of group g is
// x[g*gs + k*es], NormGeometry in sim/layout.hpp):
//   mean = (sum_k x) / E;  ss = sum_k (x_k - mean)^2  (in order k = 0, 1..)
//   rstd = 1 / sqrt(ss / E + eps)
//   running (BatchNorm, rm != null): rm = rm * (1 - m) + mean * m;
//     rv = rv * (1 - m) + (ss / (E - 1)) * m
// threads: G.
struct NormStats {
  const float* x;
  float* mean;
  float* rstd;
  float* rm;
  float* rv;
  int64_t E, gs, es;
  float eps, momentum;
  ACCUMCHECK_HD void operator()(int64_t g) const {
    const float* xg = x + g * gs;
    float s = 0.0f;
    for (int64_t k = 0; k < E; ++k) s = s + xg[k * es];
    const float mu = s / float(E);
    float ss = 0.0f;
    for (int64_t k = 0; k < E; ++k) {
      const float d = xg[k * es] - mu;
      ss = ss + d * d;
    }
    mean[g] = mu;
    rstd[g] = 1.0f / dm::sqrt(ss / float(E) + eps);
    if (rm) {
      const float omm = 1.0f - momentum;
      rm[g] = rm[g] * omm + mu * momentum;
      rv[g] = rv[g] * omm + (ss / float(E - 1)) * momentum;
    }
  }
};

// The group of element (r, c): c for BatchNorm (row_groups = 0), else
// r * ng + c / (cols / ng) with ng = row_groups (LayerNorm: ng = 1).
ACCUMCHECK_HD inline int64_t norm_group_of(int64_t r, int64_t c, int64_t cols,
                                           int64_t row_groups) {
  return row_groups == 0 ? c : r * row_groups + c / (cols / row_groups);
}

// xh[r, c] = (x - mean[g]) * rstd[g];  y = xh * gamma[c] + beta[c]  (set),
// g = norm_group_of(r, c).  threads: rows*cols.
struct NormApply {
  const float* x;
  const float* mean;
  const float* rstd;
  const float* gamma;
  const float* beta;
  float* xh;
  float* y;
  int64_t cols;
  int64_t row_groups;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const int64_t r = i / cols, c = i - r * cols;
    const int64_t g = norm_group_of(r, c, cols, row_groups);
    const float v = (x[i] - mean[g]) * rstd[g];
    xh[i] = v;
    y[i] = v * gamma[c] + beta[c];
  }
};

// dgamma[c] += sum_r dy[r, c] * xh[r, c];  dbeta[c] += sum_r dy[r, c]
// (each sum over r = 0, 1, ... first, then added once).  threads: cols.
struct NormAffineGrad {
  const float* dy;
  const float* xh;
  float* dgamma;
  float* dbeta;
  int64_t rows, cols;
  ACCUMCHECK_HD void operator()(int64_t c) const {
    float sg = 0.0f, sb = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      sg = sg + dy[r * cols + c] * xh[r * cols + c];
      sb = sb + dy[r * cols + c];
    }
    dgamma[c] = dgamma[c] + sg;
    dbeta[c] = dbeta[c] + sb;
  }
};

// Per group g, with dxh_k = dy_k * gamma[c_k]:
//   s1[g] = (sum_k dxh_k) / E;  s2[g] = (sum_k dxh_k * xh_k) / E
// (layout as NormStats; c_k = g for BatchNorm, row_groups = 0, else
// (g % ng) * E + k).  threads: G.
struct NormBackwardStats {
  const float* dy;
  const float* xh;
  const float* gamma;
  float* s1;
  float* s2;
  int64_t E, gs, es;
  int64_t row_groups;
  ACCUMCHECK_HD void operator()(int64_t g) const {
    float a = 0.0f, b = 0.0f;
    const int64_t c0 = row_groups == 0 ? 0 : (g % row_groups) * E;
    for (int64_t k = 0; k < E; ++k) {
      const int64_t i = g * gs + k * es;
      const float d = dy[i] * gamma[row_groups == 0 ? g : c0 + k];
      a = a + d;
      b = b + d * xh[i];
    }
    s1[g] = a / float(E);
    s2[g] = b / float(E);
  }
};

// dx = ((dy * gamma[c] - s1[g]) - xh * s2[g]) * rstd[g]   (set).
// threads: rows * cols.
struct NormBackwardApply {
  const float* dy;
  const float* xh;
  const float* gamma;
  const float* s1;
  const float* s2;
  const float* rstd;
  float* dx;
  int64_t cols;
  int64_t row_groups;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const int64_t r = i / cols, c = i - r * cols;
    const int64_t g = norm_group_of(r, c, cols, row_groups);
    const float dxh = dy[i] * gamma[c];
    dx[i] = ((dxh - s1[g]) - xh[i] * s2[g]) * rstd[g];
  }
};

// Embedding backward without scatter or atomics: one thread per element
// (v, j) of the table sums, in row order, the rows r whose token is v:
//   dE[v, j] += sum_{r: tok[r] = v} dh[r, j]   (added once; untouched if
// no row has token v).  threads: vocab * dim.
struct EmbeddingGrad {
  const float* dh;
  const int64_t* tok;
  float* dE;
  int64_t rows, dim;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const int64_t v = i / dim, j = i - v * dim;
    float s = 0.0f;
    bool any = false;
    for (int64_t r = 0; r < rows; ++r)
      if (tok[r] == v) {
        s = any ? s + dh[r * dim + j] : dh[r * dim + j];
        any = true;
      }
    if (any) dE[i] = dE[i] + s;
  }
};

// dst += src: PyTorch's AccumulateGrad (the fresh gradient is computed in
// full, then added once).  threads: n.
struct AccumulateGrad {
  float* dst;
  const float* src;
  ACCUMCHECK_HD void operator()(int64_t i) const { dst[i] = dst[i] + src[i]; }
};

// Formats of a gradient buffer (sim/scenario.hpp GradBuffer, same order).
enum class Fmt : int32_t { fp32 = 0, bf16 = 1, fp16 = 2 };

// x rounded to the format: round to nearest, ties to even; a value beyond
// the format's largest finite one becomes +-inf; NaN stays NaN.
//   bf16: 8 significant bits, float32's exponent range: the upper half of
//         the float's bits, rounded on the lower half.
//   fp16: 11 significant bits, normal from 2^-14, subnormal quantum 2^-24,
//         largest 65504: x / q rounded to an integer (|x / q| < 2^11, so
//         (y + 1.5*2^23) - 1.5*2^23 rounds it to nearest even in float),
//         times the quantum q = 2^(max(e, -14) - 10), e = x's exponent.
ACCUMCHECK_HD inline float round_to(Fmt f, float x) {
  if (f == Fmt::fp32 || !(x == x)) return x;
  const uint32_t u = uint32_t(dm::float_as_int(x));
  if (f == Fmt::bf16) {
    const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
    return dm::int_as_float(int32_t(r & 0xffff0000u));
  }
  const int32_t e = int32_t((u >> 23) & 0xffu) - 127;
  const int32_t qexp = (e < -14 ? -14 : e) - 10;  // >= -24: a normal float
  const float q = dm::int_as_float((qexp + 127) << 23);
  const float y = x / q;             // exact: a power-of-two divisor
  const float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float r = ((y + kMagic) - kMagic) * q;
  const float kMax = 65504.0f;
  if (r > kMax) return dm::int_as_float(0x7f800000);
  if (r < -kMax) return dm::int_as_float(int32_t(0xff800000u));
  return r;
}

// dst = rnd(dst + rnd(src)) in the buffer's format: a fresh float32
// gradient rounded into a bf16/fp16 .grad, added through float32 and
// rounded back (PyTorch adds reduced-precision tensors through float).
// Fmt::fp32 is AccumulateGrad.  threads: n.
struct AccumulateGradRounded {
  float* dst;
  const float* src;
  Fmt fmt;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    dst[i] = round_to(fmt, dst[i] + round_to(fmt, src[i]));
  }
};

// out[0] = the number of non-finite g[i] (GradScaler's found_inf: inf or
// NaN in any element), counted in order (one thread).  threads: 1.
struct CountNonFinite {
  const float* g;
  int64_t n;
  float* out;
  ACCUMCHECK_HD void operator()(int64_t) const {
    float c = 0.0f;
    for (int64_t i = 0; i < n; ++i)
      if (!(g[i] - g[i] == 0.0f)) c = c + 1.0f;  // inf - inf, NaN: NaN
    out[0] = c;
  }
};

// dst = value.  threads: n.
struct Fill {
  float* dst;
  float value;
  ACCUMCHECK_HD void operator()(int64_t i) const { dst[i] = value; }
};

// Per-sample MSE: loss[r] = (sum_c (y - t)^2, in order c = 0, 1, ...) / d_out.
// threads: rows.
struct MseLossForward {
  const float* y;
  const float* t;
  float* loss;
  int64_t cols;
  ACCUMCHECK_HD void operator()(int64_t r) const {
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float d = y[r * cols + c] - t[r * cols + c];
      s = s + d * d;
    }
    loss[r] = s / float(cols);
  }
};

// dy = w * (2 (y - t) / d_out), w = 1/den (set).  threads: rows * cols.
struct MseLossBackward {
  const float* y;
  const float* t;
  float* dy;
  int64_t cols;
  float w;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const float g = (2.0f * (y[i] - t[i])) / float(cols);
    dy[i] = w * g;
  }
};

// Per-sample cross entropy with max subtraction:
//   m = max_c y[r, c];  s = sum_c exp(y[r, c] - m)  (in order c = 0, 1, ...)
//   loss[r] = log(s) - (y[r, label] - m)
// and the row statistics m, s for the backward.  threads: rows.
struct CrossEntropyForward {
  const float* y;
  const int32_t* label;
  float* loss;
  float* row_max;
  float* row_sum;
  int64_t cols;
  ACCUMCHECK_HD void operator()(int64_t r) const {
    const float* row = y + r * cols;
    float m = row[0];
    for (int64_t c = 1; c < cols; ++c) m = row[c] > m ? row[c] : m;
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) s = s + dm::ac_expf(row[c] - m);
    loss[r] = dm::ac_logf(s) - (row[label[r]] - m);
    row_max[r] = m;
    row_sum[r] = s;
  }
};

// dy[r, c] = w * (exp(y[r, c] - m_r) / s_r - [c == label_r])  (set).
// threads: rows * cols.
struct CrossEntropyBackward {
  const float* y;
  const int32_t* label;
  const float* row_max;
  const float* row_sum;
  float* dy;
  int64_t cols;
  float w;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    const int64_t r = i / cols, c = i - r * cols;
    const float p = dm::ac_expf(y[i] - row_max[r]) / row_sum[r];
    const float g = c == int64_t(label[r]) ? p - 1.0f : p;
    dy[i] = w * g;
  }
};

// out[0] = sum_i src[i] in order i = 0, 1, ... (one thread).  threads: 1.
struct SumSerial {
  const float* src;
  int64_t n;
  float* out;
  ACCUMCHECK_HD void operator()(int64_t) const {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s = s + src[i];
    out[0] = s;
  }
};

// out[0] = sqrt(sum_i g[i]^2), in order i = 0, 1, ... (one thread; the
// square rounded, then added).  threads: 1.
struct GradNorm {
  const float* g;
  int64_t n;
  float* out;
  ACCUMCHECK_HD void operator()(int64_t) const {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s = s + g[i] * g[i];
    out[0] = dm::sqrt(s);
  }
};

// g = rnd(g * f), rounded to the buffer's format (clip_grad_norm_'s
// and unscale_'s mul_ on a bf16/fp16 .grad).  threads: n.
struct ScaleGrads {
  float* g;
  float f;
  Fmt fmt = Fmt::fp32;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    g[i] = round_to(fmt, g[i] * f);
  }
};

// g += coef * p, coef = float(lambda / den).  threads: n.
struct AddL2 {
  float* g;
  const float* p;
  float coef;
  ACCUMCHECK_HD void operator()(int64_t i) const { g[i] = g[i] + coef * p[i]; }
};

// torch.optim.SGD (PyTorch 1.13 _single_tensor_sgd, no dampening, no
// nesterov), scalars rounded to float as PyTorch does:
//   d = g + wd * p                           (if wd != 0)
//   buf = first ? d : momentum * buf + d;  d = buf   (if momentum != 0)
//   p = p + (-lr) * d
// threads: n.
struct SgdStep {
  float* p;
  const float* g;
  float* buf;
  float neg_lr, momentum, wd;
  bool use_wd, use_momentum, first;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    float d = g[i];
    if (use_wd) d = d + wd * p[i];
    if (use_momentum) {
      const float b = first ? d : buf[i] * momentum + d;
      buf[i] = b;
      d = b;
    }
    p[i] = p[i] + neg_lr * d;
  }
};

// torch.optim.Adam / AdamW (PyTorch 1.13 _single_tensor_adam / _adamw):
//   AdamW: p = p * decay_mul, decay_mul = float(1 - lr * wd)   (first)
//   Adam:  d = g + wd * p                                      (if wd != 0)
//   m = m * b1 + one_minus_b1 * d                 (mul_, add_ alpha)
//   v = v * b2 + (one_minus_b2 * d) * d           (mul_, addcmul_ value)
//   denom = sqrt(v) / bc2_sqrt + eps
//   p = p + neg_step_size * (m / denom)           (addcdiv_ value)
// with step_size = lr / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t) computed
// in double and rounded to float.  threads: n.
struct AdamStep {
  float* p;
  const float* g;
  float* m;
  float* v;
  float b1, one_minus_b1, b2, one_minus_b2;
  float neg_step_size, bc2_sqrt, eps;
  float wd, decay_mul;
  bool coupled_wd, decoupled_wd;
  ACCUMCHECK_HD void operator()(int64_t i) const {
    float pi = p[i];
    if (decoupled_wd) pi = pi * decay_mul;
    float d = g[i];
    if (coupled_wd) d = d + wd * pi;
    const float mi = m[i] * b1 + one_minus_b1 * d;
    const float vi = v[i] * b2 + (one_minus_b2 * d) * d;
    m[i] = mi;
    v[i] = vi;
    const float denom = dm::sqrt(vi) / bc2_sqrt + eps;
    p[i] = pi + neg_step_size * (mi / denom);
  }
};

}  // namespace accumcheck::kern
