// The oracle's number type and its reductions.
//
// OracleReal is MPFR with variable precision, chosen by measurement at 50
// digits (M multiply-adds/s; a scalar loop / bench/oracle_bench.cpp's
// 64x256 GEMV): Boost operators on mpfr_float (variable) 24 / 21, fixed
// mpfr_float_50 28 / 22, cpp_bin_float_50 16 / 18; raw mpfr_mul+mpfr_add
// 36 / 30, mpfr_fma 25 / 21.  The fixed type is at most ~15% faster
// through Boost but cannot honour `--digits`, so the oracle uses the
// variable type and sends its reductions (nearly all of its time) straight
// to MPFR (mul + add), which runs at the raw rate.
//
// Precision: set_oracle_digits() sets Boost's global default precision
// (decimal digits); every OracleReal created afterwards gets it.  Call it
// before creating oracles or their inputs; values created earlier keep
// theirs.  Not thread-safe (Boost 1.74 keeps one global default).
//
// Reductions.  Every dot product and sum in the oracle goes through
// dot_into / sum_into / max_into: the float32 engine sends these to a BLAS
// in an unknown order, so for Tracked (oracle/tracked.hpp) they carry an
// order-independent bound instead of a chain of per-operation roundings.
// Plain types just sum in index order.
#pragma once

#include <boost/multiprecision/mpfr.hpp>
#include <cmath>
#include <cstdint>

namespace accumcheck {

using OracleReal =
    boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<0>>;

inline constexpr unsigned kDefaultOracleDigits = 50;

// The number type under Tracked<> when only the float32 bound matters
// (certify's teacher-forced passes): 40 fixed decimal digits on the stack,
// no expression templates, so an elementwise operation allocates nothing.
// The value's own rounding (10^-40) is far below any float32 bound.
using BoundReal = boost::multiprecision::number<
    boost::multiprecision::mpfr_float_backend<
        40, boost::multiprecision::allocate_stack>,
    boost::multiprecision::et_off>;

// Sets the precision (decimal digits) of OracleReal values created from now
// on.  Throws std::invalid_argument below 20 digits: the oracle must be far
// more precise than float32 for the error model to hold.
void set_oracle_digits(unsigned digits);
unsigned oracle_digits();

// out = (init ? *init : 0) + sum_{k<n} a[k*sa] * b[k*sb].  `init` may be
// &out; `a` and `b` must not overlap `out`.  The sum is formed first and
// the initial value added last, so accumulating the same terms twice into
// a zeroed buffer gives exactly twice them (the backward `+=` contract).
template <class T>
void dot_into(T& out, const T* init, int64_t n, const T* a, int64_t sa,
              const T* b, int64_t sb) {
  T acc = T(0);
  for (int64_t k = 0; k < n; ++k) acc += a[k * sa] * b[k * sb];
  if (init) acc += *init;
  out = acc;
}

// out = (init ? *init : 0) + sum_{k<n} a[k*sa], the same way.
template <class T>
void sum_into(T& out, const T* init, int64_t n, const T* a, int64_t sa) {
  T acc = T(0);
  for (int64_t k = 0; k < n; ++k) acc += a[k * sa];
  if (init) acc += *init;
  out = acc;
}

// out = max_{k<n} a[k*sa] (n >= 1).
template <class T>
void max_into(T& out, int64_t n, const T* a, int64_t sa) {
  out = a[0];
  for (int64_t k = 1; k < n; ++k)
    if (out < a[k * sa]) out = a[k * sa];
}

// MPFR fast paths (no allocation: one thread-local scratch value).
void dot_into(OracleReal& out, const OracleReal* init, int64_t n,
              const OracleReal* a, int64_t sa, const OracleReal* b, int64_t sb);
void sum_into(OracleReal& out, const OracleReal* init, int64_t n,
              const OracleReal* a, int64_t sa);

// Frees the calling thread's MPFR state: its scratch values (above), and
// MPFR's per-thread caches of constants (pi, log 2, ...) and its pool of
// small limb blocks (mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE)).  MPFR frees
// those only on request, so every thread other than main that does MPFR
// work must end with this (a ThreadCacheRelease at the top of its body),
// or each such thread leaks them (LeakSanitizer reports it).  The thread
// may use MPFR again afterwards; it must release again before it ends.
void release_thread_caches();

// Calls release_thread_caches() when it goes out of scope: declare one
// first thing in a worker thread's body.
struct ThreadCacheRelease {
  ThreadCacheRelease() = default;
  ThreadCacheRelease(const ThreadCacheRelease&) = delete;
  ThreadCacheRelease& operator=(const ThreadCacheRelease&) = delete;
  ~ThreadCacheRelease() { release_thread_caches(); }
};

// x > 0 ? a : b.  For Tracked, a decision the float32 engine could take
// the other way widens the bound (oracle/tracked.hpp).
template <class T>
T branch_positive(const T& x, const T& a, const T& b) {
  return x > T(0) ? a : b;
}

// How the oracle makes the scalars a float32 engine would get, per number
// type (specialized for Tracked in oracle/tracked.hpp).
//   Host: the type in which a float32 engine's host computes scalars
//     (Python doubles in PyTorch: Adam's bias corrections, lr/(1-b1^t));
//     the oracle itself computes them exactly.
//   from_host(h): such a scalar as the engine sees it (rounded once).
//   from_constant(h): a mathematical constant the engine stores in float.
template <class T>
struct Num {
  using Host = T;
  static T from_host(const Host& h) { return h; }
  static T from_constant(const Host& h) { return h; }
};
template <>
struct Num<float> {
  using Host = double;
  static float from_host(double h) { return float(h); }
  static float from_constant(double h) { return float(h); }
};
template <>
struct Num<double> {
  using Host = double;
  static double from_host(double h) { return h; }
  static double from_constant(double h) { return h; }
};

}  // namespace accumcheck
