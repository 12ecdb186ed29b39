#include "oracle/real.hpp"

#include <mpfr.h>

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

// One scratch mpfr_t per thread, resized to the precision asked for.
struct Scratch {
  mpfr_t t;
  Scratch() { mpfr_init2(t, 64); }
  ~Scratch() { mpfr_clear(t); }
  mpfr_ptr at(mpfr_prec_t prec) {
    if (mpfr_get_prec(t) != prec) mpfr_set_prec(t, prec);
    return t;
  }
};

mpfr_ptr scratch(mpfr_prec_t prec) {
  thread_local Scratch s;
  return s.at(prec);
}

}  // namespace

void dot_into(OracleReal& out, const OracleReal* init, int64_t n,
              const OracleReal* a, int64_t sa, const OracleReal* b,
              int64_t sb) {
  mpfr_ptr r = out.backend().data();
  if (init == nullptr)
    mpfr_set_zero(r, 1);
  else if (init != &out)
    mpfr_set(r, init->backend().data(), MPFR_RNDN);
  mpfr_ptr t = scratch(mpfr_get_prec(r));
  for (int64_t k = 0; k < n; ++k) {
    mpfr_mul(t, a[k * sa].backend().data(), b[k * sb].backend().data(),
             MPFR_RNDN);
    mpfr_add(r, r, t, MPFR_RNDN);
  }
}

void sum_into(OracleReal& out, const OracleReal* init, int64_t n,
              const OracleReal* a, int64_t sa) {
  mpfr_ptr r = out.backend().data();
  if (init == nullptr)
    mpfr_set_zero(r, 1);
  else if (init != &out)
    mpfr_set(r, init->backend().data(), MPFR_RNDN);
  for (int64_t k = 0; k < n; ++k)
    mpfr_add(r, r, a[k * sa].backend().data(), MPFR_RNDN);
}

}  // namespace accumcheck
