// The error model: the one place where float32 tolerances come from.
// (Filled in by the oracle work; this header pins the constants that the
// device's own math functions promise and that gpu/ tests verify.)
#pragma once

namespace accumcheck::error_model {

// Unit roundoff of float32 (round to nearest): u = 2^-24.
inline constexpr double kUnitRoundoff32 = 1.0 / 16777216.0;

// Accuracy promised by gpu/device_math.hpp for finite inputs, in units of
// u, verified against the oracle in tests/device_math_test.cpp:
//   |exp~(x) - exp(x)|   <= kExpUlp  * u * exp(x)        (|x| <= 87)
//   |tanh~(x) - tanh(x)| <= kTanhUlp * u * |tanh(x)|
//   |erf~(x) - erf(x)|   <= kErfUlp  * u * |erf(x)|
//   |log~(x) - log(x)|   <= kLogUlp  * u * max(1, |log(x)|)   (x > 0)
inline constexpr double kExpUlp = 8;
inline constexpr double kTanhUlp = 8;
inline constexpr double kErfUlp = 8;
inline constexpr double kLogUlp = 8;

}  // namespace accumcheck::error_model
