// The device math functions (gpu/device_math.hpp) against long double
// references over a dense sample of their domains, in the error model's
// own units (oracle/error_model.hpp).  The measured maxima are printed and
// recorded as test properties.
#include "gpu/device_math.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>

#include "oracle/error_model.hpp"

namespace accumcheck {
namespace {

namespace em = error_model;

struct Worst {
  double err = 0;  // in units of u (the error model's form)
  float at = 0;
};

// Visits every `stride`-th float in [lo, hi] (by bit pattern, both signs),
// plus lo and hi themselves.
void for_floats(float lo, float hi, uint32_t stride,
                const std::function<void(float)>& f) {
  f(lo);
  f(hi);
  auto walk = [&](float from, float to) {  // 0 <= from <= to
    for (uint32_t b = std::bit_cast<uint32_t>(from);
         b <= std::bit_cast<uint32_t>(to); b += stride) {
      const float x = std::bit_cast<float>(b);
      if (x >= lo && x <= hi) f(x);
      if (-x >= lo && -x <= hi) f(-x);
      if (std::bit_cast<uint32_t>(to) - b < stride) break;
    }
  };
  const float a = std::max(0.0f, lo < 0 ? 0.0f : lo);
  const float b = std::max(std::fabs(lo), std::fabs(hi));
  walk(a, b);
}

void report(const char* name, const Worst& w, double bound) {
  std::printf("[ device_math ] %-5s max error %.3f u at x = %.9g (bound %g)\n",
              name, w.err, double(w.at), bound);
  ::testing::Test::RecordProperty(std::string(name) + "_max_u",
                                  std::to_string(w.err));
}

constexpr double kU = em::kUnitRoundoff32;

TEST(DeviceMath, ExpWithinErrorModel) {
  Worst w;
  for_floats(-87.0f, 87.0f, 61, [&](float x) {
    const long double ref = std::exp(static_cast<long double>(x));
    const long double got = dm::ac_expf(x);
    const double e = double(std::fabs(got - ref) / (kU * ref));
    if (e > w.err) w = {e, x};
  });
  report("exp", w, em::kExpUlp);
  EXPECT_LE(w.err, em::kExpUlp) << "at x = " << w.at;
}

TEST(DeviceMath, LogWithinErrorModel) {
  Worst w;
  auto check = [&](float x) {
    if (!(x > 0)) return;
    const long double ref = std::log(static_cast<long double>(x));
    const long double got = dm::ac_logf(x);
    const double e =
        double(std::fabs(got - ref) / (kU * std::max(1.0L, std::fabs(ref))));
    if (e > w.err) w = {e, x};
  };
  // Every positive float, subnormals included, by stride.
  for (uint32_t b = 1; b < 0x7f800000u; b += 37) check(std::bit_cast<float>(b));
  // Densely around 1, where the error is absolute.
  for_floats(0.5f, 2.0f, 1, check);
  report("log", w, em::kLogUlp);
  EXPECT_LE(w.err, em::kLogUlp) << "at x = " << w.at;
}

TEST(DeviceMath, TanhWithinErrorModel) {
  Worst w;
  auto check = [&](float x) {
    const long double ref = std::tanh(static_cast<long double>(x));
    if (ref == 0) {
      EXPECT_EQ(dm::ac_tanhf(x), 0.0f);
      return;
    }
    const long double got = dm::ac_tanhf(x);
    const double e = double(std::fabs(got - ref) / (kU * std::fabs(ref)));
    if (e > w.err) w = {e, x};
  };
  for_floats(-20.0f, 20.0f, 401, check);
  for_floats(0.55f, 0.7f, 7, check);  // the Taylor / exp seam
  report("tanh", w, em::kTanhUlp);
  EXPECT_LE(w.err, em::kTanhUlp) << "at x = " << w.at;
}

TEST(DeviceMath, ErfWithinErrorModel) {
  Worst w;
  int64_t subnormal_misses = 0;
  auto check = [&](float x) {
    const long double ref = std::erf(static_cast<long double>(x));
    // A subnormal result cannot carry relative accuracy (no function can):
    // there the error is judged in subnormal ulps (at most one).
    const long double floor = std::numeric_limits<float>::min();
    if (std::fabs(ref) < floor) {
      const long double tiny = std::numeric_limits<float>::denorm_min();
      if (std::fabs(dm::ac_erff(x) - ref) > tiny) ++subnormal_misses;
      return;
    }
    const long double got = dm::ac_erff(x);
    const double e = double(std::fabs(got - ref) / (kU * std::fabs(ref)));
    if (e > w.err) w = {e, x};
  };
  for_floats(-6.0f, 6.0f, 401, check);
  for_floats(0.9f, 1.1f, 7, check);  // the series / fraction seam
  report("erf", w, em::kErfUlp);
  EXPECT_EQ(subnormal_misses, 0);
  EXPECT_LE(w.err, em::kErfUlp) << "at x = " << w.at;
}

TEST(DeviceMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(dm::ac_expf(0.0f), 1.0f);
  EXPECT_EQ(dm::ac_expf(inf), inf);
  EXPECT_EQ(dm::ac_expf(-inf), 0.0f);
  EXPECT_EQ(dm::ac_expf(100.0f), inf);
  EXPECT_TRUE(std::isnan(dm::ac_expf(nan)));
  EXPECT_EQ(dm::ac_logf(1.0f), 0.0f);
  EXPECT_EQ(dm::ac_logf(0.0f), -inf);
  EXPECT_EQ(dm::ac_logf(inf), inf);
  EXPECT_TRUE(std::isnan(dm::ac_logf(-1.0f)));
  EXPECT_EQ(dm::ac_tanhf(0.0f), 0.0f);
  EXPECT_EQ(dm::ac_tanhf(inf), 1.0f);
  EXPECT_EQ(dm::ac_tanhf(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(dm::ac_tanhf(nan)));
  EXPECT_EQ(dm::ac_erff(0.0f), 0.0f);
  EXPECT_EQ(dm::ac_erff(inf), 1.0f);
  EXPECT_EQ(dm::ac_erff(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(dm::ac_erff(nan)));
  // Odd functions stay odd, bit for bit.
  for (float x : {0.1f, 0.7f, 1.5f, 3.0f}) {
    EXPECT_EQ(dm::ac_tanhf(-x), -dm::ac_tanhf(x));
    EXPECT_EQ(dm::ac_erff(-x), -dm::ac_erff(x));
  }
}

}  // namespace
}  // namespace accumcheck
