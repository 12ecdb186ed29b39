// The float32 engine's own transcendental functions.
//
// Written for accumcheck from textbook identities (range reduction plus a
// truncated Taylor / continued-fraction expansion), with every fused
// multiply-add spelled fmaf and every other operation a single IEEE-754
// float operation (+, -, *, /, sqrtf are correctly rounded on the host and
// on the GPU with nvcc's default -prec-div/-prec-sqrt, and the project
// compiles with -ffp-contract=off / --fmad=false).  The emulated and the
// CUDA executor therefore compute identical bits here: never call the CUDA
// intrinsics or the std:: versions from a kernel body.
//
// Accuracy (oracle/error_model.hpp, verified by tests/device_math_test.cpp):
//   ac_expf   |x| <= 87        rel. error <= kExpUlp  * u
//   ac_logf   x > 0            abs. error <= kLogUlp  * u * max(1, |log x|)
//   ac_tanhf  all finite x     rel. error <= kTanhUlp * u
//   ac_erff   all finite x     rel. error <= kErfUlp  * u
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define ACCUMCHECK_HD __host__ __device__
#else
#define ACCUMCHECK_HD
#endif

namespace accumcheck::dm {

ACCUMCHECK_HD inline int32_t float_as_int(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_int(x);
#else
  return std::bit_cast<int32_t>(x);
#endif
}

ACCUMCHECK_HD inline float int_as_float(int32_t i) {
#ifdef __CUDA_ARCH__
  return __int_as_float(i);
#else
  return std::bit_cast<float>(i);
#endif
}

// a*b + c with a single rounding (IEEE fusedMultiplyAdd).
ACCUMCHECK_HD inline float fma(float a, float b, float c) {
  return ::fmaf(a, b, c);
}

// Correctly rounded square root.
ACCUMCHECK_HD inline float sqrt(float x) { return ::sqrtf(x); }

ACCUMCHECK_HD inline bool is_nan(float x) { return x != x; }

// 2^k for -126 <= k <= 127, exactly.
ACCUMCHECK_HD inline float pow2i(int32_t k) {
  return int_as_float((k + 127) << 23);
}

// Round to the nearest integer (ties to even) for |x| < 2^22.
ACCUMCHECK_HD inline float round_small(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float t = x + magic;
  return t - magic;
}

// exp(x).  x = k*ln2 + r, |r| <= ln2/2 (Cody-Waite with a two-part ln2 and
// fmaf), exp(r) by its Taylor polynomial of degree 8 (truncation < 2^-31),
// then scaled by 2^k in two exact steps (so subnormal results round once
// at most twice: only for x < -87.3, outside the promised domain).
ACCUMCHECK_HD inline float ac_expf(float x) {
  if (is_nan(x)) return x;
  if (x > 88.72284f) return int_as_float(0x7f800000);  // +inf
  if (x < -103.97208f) return 0.0f;
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693145751953125f;  // 16 significant bits
  const float kLn2Lo = 1.42860682030941723e-6f;
  const float k = round_small(x * kLog2e);
  float r = fma(-k, kLn2Hi, x);  // exact: k*kLn2Hi has <= 24 bits
  r = fma(-k, kLn2Lo, r);
  float p = float(1.0 / 40320.0);
  p = fma(p, r, float(1.0 / 5040.0));
  p = fma(p, r, float(1.0 / 720.0));
  p = fma(p, r, float(1.0 / 120.0));
  p = fma(p, r, float(1.0 / 24.0));
  p = fma(p, r, float(1.0 / 6.0));
  p = fma(p, r, 0.5f);
  p = fma(p, r * r, r);  // r + r^2 * (1/2 + r/6 + ...)
  p = p + 1.0f;
  const int32_t ki = int32_t(k);
  const int32_t k1 = ki / 2;
  return (p * pow2i(k1)) * pow2i(ki - k1);
}

// log(x), x > 0.  x = 2^e * m with m in [sqrt(1/2), sqrt(2)), f = m - 1
// (exact), s = f / (2 + f), log(1+f) = 2 atanh(s)
//   = f - (f^2/2 - s * (f^2/2 + R(s^2))),  R = 2z/3 + 2z^2/5 + ... (z = s^2)
// so the division's rounding only enters a small correction term.
ACCUMCHECK_HD inline float ac_logf(float x) {
  if (is_nan(x)) return x;
  if (x < 0.0f) return int_as_float(0x7fc00000);            // NaN
  if (x == 0.0f) return int_as_float(int32_t(0xff800000));  // -inf
  if (x == int_as_float(0x7f800000)) return x;
  int32_t e = 0;
  if (x < 1.17549435e-38f) {  // subnormal: scale into the normal range
    x = x * 8388608.0f;       // 2^23, exact
    e = -23;
  }
  int32_t bits = float_as_int(x);
  e += ((bits >> 23) & 0xff) - 127;
  float m = int_as_float((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
  if (m > 1.41421356f) {
    m = m * 0.5f;
    e += 1;
  }
  const float f = m - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  float R = float(2.0 / 13.0);
  R = fma(R, z, float(2.0 / 11.0));
  R = fma(R, z, float(2.0 / 9.0));
  R = fma(R, z, float(2.0 / 7.0));
  R = fma(R, z, float(2.0 / 5.0));
  R = fma(R, z, float(2.0 / 3.0));
  R = R * z;
  const float hfsq = 0.5f * f * f;
  const float log_m = f - fma(-s, hfsq + R, hfsq);
  const float kLn2Hi = 0.693145751953125f;
  const float kLn2Lo = 1.42860682030941723e-6f;
  const float fe = float(e);
  return fma(fe, kLn2Hi, fma(fe, kLn2Lo, log_m));
}

// tanh(x).  |x| < 0.625: the odd Taylor series to x^23 (its coefficients
// from tanh' = 1 - tanh^2); otherwise 1 - 2 / (exp(2|x|) + 1), with the sign.
ACCUMCHECK_HD inline float ac_tanhf(float x) {
  if (is_nan(x)) return x;
  const float a = x < 0.0f ? -x : x;
  float t;
  if (a < 0.625f) {
    const float z = a * a;
    float p = float(-113927491862.0 / 2900518163668125.0);
    p = fma(p, z, float(18888466084.0 / 194896477400625.0));
    p = fma(p, z, float(-443861162.0 / 1856156927625.0));
    p = fma(p, z, float(6404582.0 / 10854718875.0));
    p = fma(p, z, float(-929569.0 / 638512875.0));
    p = fma(p, z, float(21844.0 / 6081075.0));
    p = fma(p, z, float(-1382.0 / 155925.0));
    p = fma(p, z, float(62.0 / 2835.0));
    p = fma(p, z, float(-17.0 / 315.0));
    p = fma(p, z, float(2.0 / 15.0));
    p = fma(p, z, float(-1.0 / 3.0));
    t = fma(p * z, a, a);  // a + a^3 * (-1/3 + ...)
  } else if (a < 12.0f) {
    const float e = ac_expf(2.0f * a);
    t = 1.0f - 2.0f / (e + 1.0f);
  } else {
    t = 1.0f;
  }
  return x < 0.0f ? -t : t;
}

// exp(-x^2) with x^2 carried as hi + lo (fmaf), for erf.
ACCUMCHECK_HD inline float exp_minus_square(float x) {
  const float hi = x * x;
  const float lo = fma(x, x, -hi);
  const float e = ac_expf(-hi);
  return fma(-lo, e, e);  // e * (1 - lo)
}

// erf(x).  |x| < 1: the Maclaurin series (2/sqrt(pi)) sum (-1)^n
// x^(2n+1) / (n! (2n+1)) to n = 12, 2/sqrt(pi) folded into the
// coefficients; 1 <= |x| < 4: 1 - erfc(x) with erfc from its continued
// fraction exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
// evaluated bottom-up at a fixed depth of 40; |x| >= 4: +-1.
ACCUMCHECK_HD inline float ac_erff(float x) {
  if (is_nan(x)) return x;
  const float a = x < 0.0f ? -x : x;
  float r;
  if (a < 1.0f) {
    constexpr double c = 1.12837916709551257390;  // 2/sqrt(pi)
    const float z = a * a;
    float p = float(c / (479001600.0 * 25.0));
    p = fma(p, z, float(-c / (39916800.0 * 23.0)));
    p = fma(p, z, float(c / (3628800.0 * 21.0)));
    p = fma(p, z, float(-c / (362880.0 * 19.0)));
    p = fma(p, z, float(c / (40320.0 * 17.0)));
    p = fma(p, z, float(-c / (5040.0 * 15.0)));
    p = fma(p, z, float(c / (720.0 * 13.0)));
    p = fma(p, z, float(-c / (120.0 * 11.0)));
    p = fma(p, z, float(c / (24.0 * 9.0)));
    p = fma(p, z, float(-c / (6.0 * 7.0)));
    p = fma(p, z, float(c / (2.0 * 5.0)));
    p = fma(p, z, float(-c / 3.0));
    // a * (c + z * p), with c split in two for one more bit.
    const float c_hi = float(c);
    const float c_lo = float(c - double(c_hi));
    r = fma(a, c_hi, a * fma(z, p, c_lo));
  } else if (a < 4.0f) {
    float f = a;
    for (int k = 40; k >= 1; --k) f = a + (0.5f * float(k)) / f;
    const float erfc =
        exp_minus_square(a) / (f * float(1.77245385090551602730));
    r = 1.0f - erfc;
  } else {
    r = 1.0f;
  }
  return x < 0.0f ? -r : r;
}

}  // namespace accumcheck::dm
