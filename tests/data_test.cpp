// Datasets and initial parameters: pure functions of (seed, sample id),
// float32-exact, dyadic where asked; CSV data with errors at file:line.
#include "sim/data.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "sim/errors.hpp"
#include "sim/layout.hpp"
#include "tests/source_dir.hpp"

namespace accumcheck {
namespace {

Scenario generated(int64_t n, std::vector<int64_t> widths, uint64_t seed,
                   bool dyadic = false, LossKind loss = LossKind::mse) {
  Scenario s;
  s.model.widths = std::move(widths);
  s.model.loss = loss;
  s.data.samples = n;
  s.data.seed = seed;
  s.data.dyadic = dyadic;
  return s;
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(Data, GeneratedIsDeterministicAndKeyedBySampleId) {
  const Scenario s = generated(20, {4, 8, 3}, 7);
  const Dataset a = make_dataset(s), b = make_dataset(s);
  EXPECT_EQ(a.n, 20);
  EXPECT_EQ(a.d_in, 4);
  EXPECT_EQ(a.d_out, 3);
  ASSERT_EQ(a.x.size(), 80u);
  ASSERT_EQ(a.y.size(), 60u);
  EXPECT_TRUE(same_bytes(a.x, b.x));
  EXPECT_TRUE(same_bytes(a.y, b.y));
  EXPECT_TRUE(a.notes.empty());

  // Different sample ids get different rows.
  std::set<std::vector<float>> rows;
  for (int64_t i = 0; i < a.n; ++i)
    rows.insert(std::vector<float>(a.input(i), a.input(i) + a.d_in));
  EXPECT_EQ(rows.size(), 20u);

  // A sample's values do not depend on the dataset size.
  const Dataset small = make_dataset(generated(5, {4, 8, 3}, 7));
  EXPECT_EQ(0, std::memcmp(small.x.data(), a.x.data(), 20 * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(small.y.data(), a.y.data(), 15 * sizeof(float)));

  // Another seed, other data.
  const Dataset c = make_dataset(generated(20, {4, 8, 3}, 8));
  EXPECT_FALSE(same_bytes(a.x, c.x));

  for (float v : a.x) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
  }
}

TEST(Data, DyadicValuesAreEighths) {
  const Dataset d = make_dataset(generated(50, {3, 2}, 3, /*dyadic=*/true));
  std::set<float> distinct;
  for (const auto* v : {&d.x, &d.y})
    for (float f : *v) {
      const float e = f * 8.0f;
      EXPECT_EQ(e, std::round(e)) << f;
      EXPECT_LE(std::fabs(e), 8.0f);
      distinct.insert(f);
    }
  EXPECT_GT(distinct.size(), 10u);
}

TEST(Data, CrossEntropyLabels) {
  const Dataset d =
      make_dataset(generated(40, {4, 5}, 1, false, LossKind::cross_entropy));
  ASSERT_EQ(d.label.size(), 40u);
  EXPECT_TRUE(d.y.empty());
  std::set<int32_t> seen(d.label.begin(), d.label.end());
  for (int32_t l : seen) {
    EXPECT_GE(l, 0);
    EXPECT_LT(l, 5);
  }
  EXPECT_GE(seen.size(), 3u);
}

TEST(Data, InitialParameters) {
  const Scenario s = generated(4, {4, 8, 3}, 11);
  const ParamLayout L = layout_of(s.model);
  const std::vector<float> p = initial_parameters(s, L),
                           q = initial_parameters(s, L);
  ASSERT_EQ(int64_t(p.size()), L.total);
  EXPECT_TRUE(same_bytes(p, q));
  for (const TensorView& t : L.tensors) {
    const float bound = float(1.0 / std::sqrt(double(t.fan_in)));
    for (int64_t k = 0; k < t.size(); ++k)
      EXPECT_LE(std::fabs(p[size_t(t.offset + k)]), bound) << t.name;
  }
  // Tensors are not copies of one another.
  EXPECT_NE(p[size_t(L.weight(0).offset)], p[size_t(L.weight(1).offset)]);

  // Dyadic: n/8 times a power of two <= 1/sqrt(fan_in), exactly.
  Scenario d = s;
  d.data.dyadic = true;
  const std::vector<float> pd = initial_parameters(d, L);
  for (const TensorView& t : L.tensors) {
    // fan_in 4 -> 1/2; fan_in 8 -> 1/4 (1/sqrt(8) = 0.35).
    const float scale = t.fan_in == 4 ? 0.5f : 0.25f;
    for (int64_t k = 0; k < t.size(); ++k) {
      const float n = pd[size_t(t.offset + k)] / scale * 8.0f;
      EXPECT_EQ(n, std::round(n));
      EXPECT_LE(std::fabs(n), 8.0f);
    }
  }
}

std::string data_dir() {
  return ::accumcheck::testing_util::source_dir() + "/tests/data";
}

Scenario csv_scenario(const std::string& path, std::vector<int64_t> widths,
                      LossKind loss = LossKind::mse) {
  Scenario s;
  s.model.widths = std::move(widths);
  s.model.loss = loss;
  s.data.source = DataSource::csv;
  s.data.csv_path = path;
  return s;
}

TEST(Data, CsvMse) {
  const Dataset d =
      make_dataset(csv_scenario(data_dir() + "/tiny_mse.csv", {2, 1}));
  EXPECT_EQ(d.n, 4);
  const std::vector<float> x = {0.5f,  -0.25f, 0.1f, 2.0f,
                                -1.0f, 0.75f,  0.0f, 1e-3f};
  const std::vector<float> y = {1.0f, -3.5f, 0.125f, 4.0f};
  EXPECT_EQ(d.x, x);
  EXPECT_EQ(d.y, y);
  // 0.1 and 1e-3 are not float32 values: rounded once, noted once.
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_EQ(d.notes[0], "2 values rounded to float32 (first at " + data_dir() +
                            "/tiny_mse.csv:3)");
}

TEST(Data, CsvCrossEntropy) {
  const Dataset d = make_dataset(csv_scenario(
      data_dir() + "/tiny_ce.csv", {3, 4, 3}, LossKind::cross_entropy));
  EXPECT_EQ(d.n, 5);
  EXPECT_EQ(d.label, (std::vector<int32_t>{0, 1, 2, 1, 2}));
  EXPECT_TRUE(d.notes.empty());
}

class CsvErrors : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    // One folder per test: CTest runs tests in parallel processes.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string dir = ::testing::TempDir() + "accumcheck_data_test_" +
                            info->test_suite_name() + "_" + info->name();
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/bad.csv";
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  void expect_error(const std::string& text, int64_t line,
                    const std::string& key, const std::string& needle,
                    std::vector<int64_t> widths = {2, 1},
                    LossKind loss = LossKind::mse) {
    const std::string path = write(text);
    try {
      make_dataset(csv_scenario(path, widths, loss));
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.line(), line) << e.what();
      EXPECT_EQ(e.key(), key) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << e.what();
    }
  }
};

TEST_F(CsvErrors, Header) {
  expect_error("x0,y0\n1,2\n", 1, "y0", "column 2 is 'y0', expected 'x1'");
  expect_error("x0,x1\n1,2\n", 1, "y0", "missing column 'y0'");
  expect_error("x0,x1,y0,extra\n1,2,3,4\n", 1, "extra", "extra column 'extra'");
  expect_error("0.5,0.25,1\n", 1, "0.5", "expected the header x0,x1,y0");
  expect_error("", 1, "", "empty file");
  expect_error("x0,x1,y0\n", 1, "", "no data rows");
}

TEST_F(CsvErrors, Rows) {
  expect_error("x0,x1,y0\n1,2,3\n1,2\n", 3, "", "too few columns");
  expect_error("x0,x1,y0\n1,2,3,4\n", 2, "", "too many columns");
  expect_error("x0,x1,y0\n1,2,3\n1,abc,3\n", 3, "x1",
               "expected a finite number (float32 range), got 'abc'");
  expect_error("x0,x1,y0\n1,2,nan\n", 2, "y0", "got 'nan'");
  expect_error("x0,x1,y0\n1,2,inf\n", 2, "y0", "got 'inf'");
  expect_error("x0,x1,y0\n1,1e39,3\n", 2, "x1", "got '1e39'");
  expect_error("x0,x1,y0\n1,,3\n", 2, "x1", "got ''");
  expect_error("x0,x1,y0\n\n", 2, "", "too few columns");
}

TEST_F(CsvErrors, Labels) {
  expect_error("x0,x1,label\n1,2,0\n1,2,3\n", 3, "label",
               "expected an integer class id in 0..2, got '3'", {2, 3},
               LossKind::cross_entropy);
  expect_error("x0,x1,label\n1,2,1.5\n", 2, "label", "got '1.5'", {2, 3},
               LossKind::cross_entropy);
  expect_error("x0,x1,label\n1,2,-1\n", 2, "label", "got '-1'", {2, 3},
               LossKind::cross_entropy);
}

TEST_F(CsvErrors, SamplesMustMatchRows) {
  const std::string path = write("x0,x1,y0\n1,2,3\n");
  Scenario s = csv_scenario(path, {2, 1});
  s.data.samples = 2;
  EXPECT_THROW(make_dataset(s), InputError);
}

TEST_F(CsvErrors, MissingFile) {
  try {
    make_dataset(csv_scenario("/nonexistent/x.csv", {2, 1}));
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "/nonexistent/x.csv");
  }
}

}  // namespace
}  // namespace accumcheck
