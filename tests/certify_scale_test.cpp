// certify at scale (issue 14): the report is the same on 1 and on 3
// threads, byte for byte; a trace judged in step ranges and merged gives
// the checks, verdict and JUnit of one certify; merging refuses parts that
// do not fit together; the double-double bound gives MPFR's verdicts.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "certify_test_util.hpp"
#include "oracle/error_model.hpp"
#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"
#include "tests/source_dir.hpp"
#include "verify/certify/certify.hpp"
#include "verify/certify/parts.hpp"

namespace accumcheck {
namespace {

using certify_test::device_trace;
using certify_test::temp_dir;

const std::string kAdam = ::accumcheck::testing_util::source_dir() +
                          "/scenarios/certify-mean-over-k.toml";

std::string junit_without_time(const CertifyReport& r) {
  return std::regex_replace(certify_junit(r), std::regex(" time=\"[^\"]*\""),
                            "");
}

CertifyReport run(const Scenario& s, const std::string& dir, int threads,
                  StepRange steps = {}, BoundArith arith = BoundArith::dd) {
  CertifyConfig cfg;
  cfg.threads = threads;
  cfg.steps = steps;
  cfg.bound_arith = arith;
  return certify(s, dir, cfg);
}

struct ScaleCase {
  const char* name;
  std::string file;
  std::vector<Pitfall> pitfalls;
};

std::vector<ScaleCase> scale_cases() {
  return {
      {"sgd_momentum_correct", certify_test::kScenario, {}},
      {"sgd_momentum_zero_grad",
       certify_test::kScenario,
       {Pitfall::zero_grad_every_micro_step}},
      {"adam_correct", kAdam, {}},
      {"adam_scheduler", kAdam, {Pitfall::scheduler_per_micro_step}},
  };
}

TEST(CertifyScale, ThreadCountDoesNotChangeTheReport) {
  for (const ScaleCase& c : scale_cases()) {
    const Scenario s = parse_scenario_file(c.file);
    const std::string dir =
        device_trace(std::string("t_") + c.name, c.pitfalls, c.file);
    const CertifyReport one = run(s, dir, 1);
    EXPECT_EQ(one.pass, c.pitfalls.empty()) << c.name;
    for (int threads : {2, 3, 7}) {
      const CertifyReport many = run(s, dir, threads);
      EXPECT_EQ(certify_text(one, 100), certify_text(many, 100))
          << c.name << " threads " << threads;
      EXPECT_EQ(junit_without_time(one), junit_without_time(many)) << c.name;
    }
  }
}

TEST(CertifyScale, PartsMergeIntoOneCertify) {
  for (const ScaleCase& c : scale_cases()) {
    const Scenario s = parse_scenario_file(c.file);
    const std::string dir =
        device_trace(std::string("p_") + c.name, c.pitfalls, c.file);
    const CertifyReport whole = run(s, dir, 2);
    const int64_t n = whole.trace_steps;
    ASSERT_GE(n, 3) << c.name;
    // Three parts, given out of order, the last one open-ended.
    const std::vector<StepRange> ranges = {
        {n / 3, 2 * n / 3}, {2 * n / 3, -1}, {0, n / 3}};
    std::vector<std::string> files;
    for (size_t k = 0; k < ranges.size(); ++k) {
      const CertifyReport part = run(s, dir, 1, ranges[k]);
      files.push_back(
          temp_dir(std::string("part_") + c.name + "_" + std::to_string(k)));
      write_file_atomically(files.back(),
                            certify_part_text(part, s.digest, "dd"));
    }
    const CertifyReport merged = certify_merge(files);
    EXPECT_EQ(merged.pass, whole.pass) << c.name;
    EXPECT_EQ(merged.verdict, whole.verdict) << c.name;
    ASSERT_EQ(merged.checks.size(), whole.checks.size()) << c.name;
    for (size_t i = 0; i < whole.checks.size(); ++i) {
      EXPECT_EQ(merged.checks[i].name, whole.checks[i].name);
      EXPECT_EQ(merged.checks[i].ok, whole.checks[i].ok);
      EXPECT_EQ(merged.checks[i].message, whole.checks[i].message);
    }
    if (whole.pass) {
      EXPECT_EQ(certify_text(merged), certify_text(whole)) << c.name;
      EXPECT_EQ(junit_without_time(merged), junit_without_time(whole));
    } else {
      // The diagnosis comes from the part holding the first failing step.
      EXPECT_NE(merged.diagnosis.find("ranked over steps"), std::string::npos);
      ASSERT_FALSE(merged.ranking.empty());
      EXPECT_EQ(merged.ranking.front().name, whole.ranking.front().name)
          << c.name;
    }
  }
}

TEST(CertifyScale, MergeRefusesPartsThatDoNotFit) {
  const Scenario& s = certify_test::scenario();
  const std::string dir = device_trace("bad_parts", {});
  auto part = [&](StepRange r, const std::string& name,
                  const std::string& digest) {
    const std::string f = temp_dir("badpart_" + name);
    write_file_atomically(f,
                          certify_part_text(run(s, dir, 1, r), digest, "dd"));
    return f;
  };
  const std::string a = part({0, 4}, "a", s.digest);
  const std::string b = part({4, -1}, "b", s.digest);
  const std::string gap = part({5, -1}, "gap", s.digest);
  const std::string overlap = part({3, -1}, "overlap", s.digest);
  const std::string other = part({4, -1}, "other", "0123456789abcdef");
  EXPECT_NO_THROW(certify_merge({a, b}));
  EXPECT_THROW(certify_merge({a}), InputError);           // steps 4:9 missing
  EXPECT_THROW(certify_merge({a, gap}), InputError);      // step 4 missing
  EXPECT_THROW(certify_merge({a, overlap}), InputError);  // step 3 twice
  EXPECT_THROW(certify_merge({a, other}), InputError);    // another scenario
  try {
    certify_merge({a, gap});
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(gap + ":"), std::string::npos)
        << e.what();
  }
  { std::ofstream(temp_dir("badpart_junk")) << "not a part\n"; }
  EXPECT_THROW(certify_merge({temp_dir("badpart_junk")}), InputError);
  EXPECT_THROW(parse_step_range("3", "--steps"), InputError);
  EXPECT_THROW(parse_step_range("5:2", "--steps"), InputError);
  EXPECT_THROW(parse_step_range("-1:2", "--steps"), InputError);
  EXPECT_EQ(parse_step_range(":4", "--steps").end, 4);
  EXPECT_EQ(parse_step_range("4:", "--steps").end, -1);
}

TEST(CertifyScale, DoubleDoubleGivesMpfrsVerdicts) {
  for (const ScaleCase& c : scale_cases()) {
    const Scenario s = parse_scenario_file(c.file);
    const std::string dir =
        device_trace(std::string("a_") + c.name, c.pitfalls, c.file);
    const CertifyReport dd = run(s, dir, 2, {}, BoundArith::dd);
    const CertifyReport mp = run(s, dir, 2, {}, BoundArith::mpfr);
    EXPECT_EQ(dd.pass, mp.pass) << c.name;
    EXPECT_EQ(dd.first_out, mp.first_out) << c.name;
    ASSERT_EQ(dd.ranking.size(), mp.ranking.size()) << c.name;
    for (size_t i = 0; i < dd.ranking.size() && i < 5; ++i)
      EXPECT_EQ(dd.ranking[i].name, mp.ranking[i].name) << c.name << " " << i;
    // The worst err/bound agrees to the table's dd_bound_rel: values
    // within tol e and bounds within tol e of MPFR's give
    // |r_dd - r_mp| <= tol (1 + r) (1 + tol) < 2 tol (1 + r).
    ASSERT_EQ(dd.checks.size(), mp.checks.size());
    const double tol = error_model::tolerance("dd_bound_rel");
    if (std::isinf(mp.max_ratio))  // a bound that reaches 0 in both
      EXPECT_EQ(dd.max_ratio, mp.max_ratio) << c.name;
    else
      EXPECT_NEAR(dd.max_ratio, mp.max_ratio, 2 * tol * (1 + mp.max_ratio))
          << c.name;
  }
}

}  // namespace
}  // namespace accumcheck
