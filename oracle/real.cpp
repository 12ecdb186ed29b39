#include "oracle/real.hpp"

#include <mpfr.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace accumcheck {

void set_oracle_digits(unsigned digits) {
  if (digits < 20)
    throw std::invalid_argument("oracle digits must be >= 20, got " +
                                std::to_string(digits));
  OracleReal::default_precision(digits);
}

unsigned oracle_digits() { return OracleReal::default_precision(); }

namespace {

// Two scratch mpfr_t per thread, resized to the precision asked for.
struct Scratch {
  mpfr_t t, acc;
  Scratch() {
    mpfr_init2(t, 64);
    mpfr_init2(acc, 64);
  }
  ~Scratch() {
    mpfr_clear(t);
    mpfr_clear(acc);
  }
  void fit(mpfr_prec_t prec) {
    if (mpfr_get_prec(t) != prec) {
      mpfr_set_prec(t, prec);
      mpfr_set_prec(acc, prec);
    }
  }
};

// Created on first use in each thread; release_thread_caches() destroys
// it before MPFR's own caches (mpfr_clear may return limbs to the pool).
thread_local std::optional<Scratch> thread_scratch;

Scratch& scratch(mpfr_prec_t prec) {
  if (!thread_scratch) thread_scratch.emplace();
  thread_scratch->fit(prec);
  return *thread_scratch;
}

// out = init + acc (init added last: see dot_into in real.hpp).
void finish(OracleReal& out, const OracleReal* init, mpfr_srcptr acc) {
  mpfr_ptr r = out.backend().data();
  if (init)
    mpfr_add(r, init->backend().data(), acc, MPFR_RNDN);
  else
    mpfr_set(r, acc, MPFR_RNDN);
}

}  // namespace

void dot_into(OracleReal& out, const OracleReal* init, int64_t n,
              const OracleReal* a, int64_t sa, const OracleReal* b,
              int64_t sb) {
  Scratch& s = scratch(mpfr_get_prec(out.backend().data()));
  mpfr_set_zero(s.acc, 1);
  for (int64_t k = 0; k < n; ++k) {
    mpfr_mul(s.t, a[k * sa].backend().data(), b[k * sb].backend().data(),
             MPFR_RNDN);
    mpfr_add(s.acc, s.acc, s.t, MPFR_RNDN);
  }
  finish(out, init, s.acc);
}

void sum_into(OracleReal& out, const OracleReal* init, int64_t n,
              const OracleReal* a, int64_t sa) {
  Scratch& s = scratch(mpfr_get_prec(out.backend().data()));
  mpfr_set_zero(s.acc, 1);
  for (int64_t k = 0; k < n; ++k)
    mpfr_add(s.acc, s.acc, a[k * sa].backend().data(), MPFR_RNDN);
  finish(out, init, s.acc);
}

void release_thread_caches() {
  thread_scratch.reset();
  mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);
}

}  // namespace accumcheck
