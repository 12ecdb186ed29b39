// The Tracked bound's number types side by side (issue 14): the GEMV a
// linear layer runs (64 x 256, bias as initial value) and an elementwise
// chain (tanh forward and backward), per backend, in multiply-adds or
// elements per second; plus a value-only dot product in our DD and, when
// Debian's libqd-dev is installed, in qd's dd_real (the library the issue
// names), so the choice of DD implementation is measured, not assumed.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/rate_reporter.hpp"
#include "oracle/dd.hpp"
#include "oracle/oracle.hpp"

#if !defined(ACCUMCHECK_NO_QD) && __has_include(<qd/dd_real.h>)
#include <qd/dd_real.h>
#define ACCUMCHECK_HAVE_QD 1
#endif

namespace {

using namespace accumcheck;
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

// Activations carry a bound (they are results of earlier float work).
template <class TR>
std::vector<TR> inexact(std::vector<TR> v) {
  for (TR& x : v) x = x * TR(0.1);  // 0.1 is not a float: e > 0
  return v;
}

template <class TR>
void BM_TrackedGemv(benchmark::State& state) {
  const auto W = random_values<TR>(kRows * kCols, 1);
  const auto x = inexact(random_values<TR>(kCols, 2));
  const auto b = random_values<TR>(kRows, 3);
  std::vector<TR> y(static_cast<size_t>(kRows));
  for (auto _ : state) {
    linear_forward(y.data(), x.data(), W.data(), b.data(), 1, kCols, kRows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

// tanh forward and its backward dout * (1 - y*y), per element.
template <class TR>
void BM_TrackedTanh(benchmark::State& state) {
  const auto x = inexact(random_values<TR>(1024, 4));
  const auto d = inexact(random_values<TR>(1024, 5));
  std::vector<TR> y(x.size()), g(x.size());
  const TR one(1);
  for (auto _ : state) {
    for (size_t i = 0; i < x.size(); ++i) {
      y[i] = tanh(x[i]);
      g[i] = d[i] * (one - y[i] * y[i]);
    }
    benchmark::DoNotOptimize(g.data());
  }
  state.SetItemsProcessed(state.iterations() * int64_t(x.size()));
}

template <class T>
void BM_ValueDot(benchmark::State& state) {
  const auto a = random_values<T>(kRows * kCols, 1);
  const auto b = random_values<T>(kRows * kCols, 2);
  for (auto _ : state) {
    T acc = T(0.0);
    for (size_t k = 0; k < a.size(); ++k) acc += a[k] * b[k];
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

using TMp = Tracked<OracleReal>;
using TBound = Tracked<BoundReal>;
using TDD = Tracked<DD>;
BENCHMARK(BM_TrackedGemv<TMp>)->Name("BM_TrackedGemv/mpfr50_var");
BENCHMARK(BM_TrackedGemv<TBound>)->Name("BM_TrackedGemv/mpfr40_stack");
BENCHMARK(BM_TrackedGemv<TDD>)->Name("BM_TrackedGemv/dd");
BENCHMARK(BM_TrackedTanh<TMp>)->Name("BM_TrackedTanh/mpfr50_var");
BENCHMARK(BM_TrackedTanh<TBound>)->Name("BM_TrackedTanh/mpfr40_stack");
BENCHMARK(BM_TrackedTanh<TDD>)->Name("BM_TrackedTanh/dd");
BENCHMARK(BM_ValueDot<DD>)->Name("BM_ValueDot/dd");
#ifdef ACCUMCHECK_HAVE_QD
BENCHMARK(BM_ValueDot<dd_real>)->Name("BM_ValueDot/qd_dd_real");
#endif
BENCHMARK(BM_ValueDot<BoundReal>)->Name("BM_ValueDot/mpfr40_stack");

}  // namespace

int main(int argc, char** argv) {
  set_oracle_digits(kDefaultOracleDigits);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  accumcheck::bench::RateReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  auto& r = rep.rate;
  const double dd = r["BM_TrackedGemv/dd"];
  const double mp = r["BM_TrackedGemv/mpfr40_stack"];
  std::printf(
      "\nTracked GEMV: dd %.1f M multiply-adds/s, mpfr40 %.1f M/s: "
      "dd / mpfr40 = %.1fx\n",
      dd / 1e6, mp / 1e6, mp > 0 ? dd / mp : 0.0);
  return 0;
}
