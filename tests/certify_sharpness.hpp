// The gate's sharpness tests (tests/certify_sharpness_*_test.cpp), what
// they share: a correct trace with one recorded value moved to 1.01x its
// bound FAILs and to 0.99x PASSes.  Each bound is computed from the trace
// and the error model's table (oracle/error_model.hpp), not read from
// certify, so a comparison loosened by 2% anywhere fails them.  Here: the
// CSV rows they edit, and the oracle's value and bound of an element as
// certify reports it (the oracle tier and its state).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "oracle/error_model.hpp"
#include "verify/certify/certify.hpp"

// A named namespace: the tests are compiled as unity sources, where an
// anonymous namespace is shared with the files beside.
namespace accumcheck::sharpness_test {

using Row = std::vector<std::string>;

inline constexpr double kU = error_model::kUnitRoundoff32;

inline std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::string f;
  std::istringstream in(line);
  while (std::getline(in, f, ',')) out.push_back(f);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

inline std::string join(const Row& r) {
  std::string o;
  for (size_t i = 0; i < r.size(); ++i) o += (i ? "," : "") + r[i];
  return o;
}

inline std::string num(double x) { return fmt::format("{:.17g}", x); }
inline double val(const std::string& s) {
  return s.empty() ? NAN : std::stod(s);
}

// The rows of the CSV file `path`.
inline std::vector<Row> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::vector<Row> out;
  for (std::string l; std::getline(in, l);) out.push_back(split(l));
  return out;
}

// Rewrites the CSV file `path` with `rows`.
inline void write_rows(const std::string& path, const std::vector<Row>& rows) {
  std::string text;
  for (const Row& r : rows) text += join(r) + "\n";
  std::ofstream(path, std::ios::trunc) << text;
}

// The oracle's value and bound of the element the check `name` reports
// worst in tensor `tensor`, its recorded value `f` (far outside).
struct Bound {
  double v = 0, e = 0;
};
inline Bound bound_of(const CertifyReport& r, const std::string& name,
                      const std::string& tensor, const std::string& element,
                      double f) {
  for (const CertifyCheck& c : r.checks) {
    if (c.name != name) continue;
    EXPECT_FALSE(c.ok) << c.message;
    const size_t at = c.message.find("worst " + element + " f=");
    EXPECT_NE(at, std::string::npos) << c.message;
    const size_t vat = c.message.find(" v=", at);
    const double v = std::stod(c.message.substr(vat + 3));
    for (const auto& [t, ratio] : c.tensor_ratio)
      if (t == tensor) return {v, std::abs(f - v) / ratio};
  }
  ADD_FAILURE() << "no check " << name << " with tensor " << tensor;
  return {};
}

}  // namespace accumcheck::sharpness_test
