// Oracle multiply-adds per second beside raw MPFR at the same precision,
// and the number-type backends the oracle was chosen from.  Prints the
// ratio oracle / raw MPFR at the end.
#include <benchmark/benchmark.h>
#include <mpfr.h>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/rate_reporter.hpp"
#include "oracle/oracle.hpp"

namespace {

using accumcheck::OracleReal;
namespace mp = boost::multiprecision;

constexpr int64_t kRows = 64, kCols = 256;

template <class T>
std::vector<T> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U(-1, 1);
  std::vector<T> v;
  v.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) v.push_back(T(U(rng)));
  return v;
}

// The oracle's GEMV as linear_forward runs it (64 x 256, bias as initial
// value): dot_into's MPFR path.
void BM_OracleGemv(benchmark::State& state) {
  const auto W = random_values<OracleReal>(kRows * kCols, 1);
  const auto x = random_values<OracleReal>(kCols, 2);
  const auto b = random_values<OracleReal>(kRows, 3);
  std::vector<OracleReal> y(static_cast<size_t>(kRows));
  for (auto _ : state) {
    accumcheck::linear_forward(y.data(), x.data(), W.data(), b.data(), 1, kCols,
                               kRows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

// The same GEMV through Boost's operators (acc += a * b), per backend.
template <class T>
void BM_BoostGemv(benchmark::State& state) {
  const auto W = random_values<T>(kRows * kCols, 1);
  const auto x = random_values<T>(kCols, 2);
  std::vector<T> y(static_cast<size_t>(kRows));
  for (auto _ : state) {
    for (int64_t o = 0; o < kRows; ++o)
      accumcheck::dot_into<T>(y[size_t(o)], nullptr, kCols,
                              &W[size_t(o * kCols)], 1, x.data(), 1);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

// Raw MPFR on preallocated mpfr_t at the oracle's precision.
template <bool kFma>
void BM_RawMpfrGemv(benchmark::State& state) {
  const mpfr_prec_t prec =
      mpfr_get_prec(OracleReal(1).backend().data());  // the oracle's
  const auto Wf = random_values<float>(kRows * kCols, 1);
  const auto xf = random_values<float>(kCols, 2);
  std::vector<mpfr_t> W(static_cast<size_t>(kRows * kCols)),
      x(static_cast<size_t>(kCols)), y(static_cast<size_t>(kRows));
  mpfr_t t;
  mpfr_init2(t, prec);
  for (size_t i = 0; i < W.size(); ++i)
    mpfr_init2(W[i], prec), mpfr_set_flt(W[i], Wf[i], MPFR_RNDN);
  for (size_t i = 0; i < x.size(); ++i)
    mpfr_init2(x[i], prec), mpfr_set_flt(x[i], xf[i], MPFR_RNDN);
  for (auto& v : y) mpfr_init2(v, prec);
  for (auto _ : state) {
    for (int64_t o = 0; o < kRows; ++o) {
      mpfr_set_zero(y[size_t(o)], 1);
      for (int64_t k = 0; k < kCols; ++k) {
        if constexpr (kFma) {
          mpfr_fma(y[size_t(o)], W[size_t(o * kCols + k)], x[size_t(k)],
                   y[size_t(o)], MPFR_RNDN);
        } else {
          mpfr_mul(t, W[size_t(o * kCols + k)], x[size_t(k)], MPFR_RNDN);
          mpfr_add(y[size_t(o)], y[size_t(o)], t, MPFR_RNDN);
        }
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
  for (auto& v : W) mpfr_clear(v);
  for (auto& v : x) mpfr_clear(v);
  for (auto& v : y) mpfr_clear(v);
  mpfr_clear(t);
}

// The error-model type, for scale.
void BM_TrackedGemv(benchmark::State& state) {
  using TR = accumcheck::Tracked<OracleReal>;
  const auto W = random_values<TR>(kRows * kCols, 1);
  const auto x = random_values<TR>(kCols, 2);
  const auto b = random_values<TR>(kRows, 3);
  std::vector<TR> y(static_cast<size_t>(kRows));
  for (auto _ : state) {
    accumcheck::linear_forward(y.data(), x.data(), W.data(), b.data(), 1, kCols,
                               kRows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

BENCHMARK(BM_OracleGemv);
BENCHMARK(BM_RawMpfrGemv<false>)->Name("BM_RawMpfrGemv/mul+add");
BENCHMARK(BM_RawMpfrGemv<true>)->Name("BM_RawMpfrGemv/fma");
BENCHMARK(BM_BoostGemv<OracleReal>)->Name("BM_BoostGemv/mpfr_float_var50");
BENCHMARK(BM_BoostGemv<mp::mpfr_float_50>)->Name("BM_BoostGemv/mpfr_float_50");
BENCHMARK(BM_BoostGemv<mp::cpp_bin_float_50>)
    ->Name("BM_BoostGemv/cpp_bin_float_50");
BENCHMARK(BM_TrackedGemv);

}  // namespace

int main(int argc, char** argv) {
  accumcheck::set_oracle_digits(accumcheck::kDefaultOracleDigits);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  accumcheck::bench::RateReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const double oracle = reporter.rate["BM_OracleGemv"];
  const double raw = reporter.rate["BM_RawMpfrGemv/mul+add"];
  std::printf(
      "\n%u digits: oracle %.2f M multiply-adds/s, raw MPFR "
      "mul+add %.2f M/s: oracle / raw = %.3f\n",
      accumcheck::oracle_digits(), oracle / 1e6, raw / 1e6,
      raw > 0 ? oracle / raw : 0.0);
  return 0;
}
