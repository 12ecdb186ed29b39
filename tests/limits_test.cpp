// Limits as data (sim/limits.hpp), overflow-checked sizes, the lazy plan
// and the window cap that make a huge epoch count cheap, and the in-place
// CSV line splitter (sim/csv_lines.hpp).  The command-level cases of issue
// 9 are tests/hardening_cli.sh (CTest: Hardening.*).
#include "sim/limits.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <limits>
#include <set>
#include <string>

#include "sim/csv_lines.hpp"
#include "sim/errors.hpp"
#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "sim/trainer.hpp"
#include "tests/source_dir.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Restores ACCUMCHECK_LIMITS (unset) when a test ends.
struct EnvGuard {
  explicit EnvGuard(const char* v) { setenv("ACCUMCHECK_LIMITS", v, 1); }
  ~EnvGuard() { unsetenv("ACCUMCHECK_LIMITS"); }
};

std::string scenario_text(const std::string& batching,
                          const std::string& data = "samples = 64") {
  return "story = \"limits\"\n[model]\nwidths = [4, 16, 2]\n[data]\n" + data +
         "\n[batching]\n" + batching +
         "\n[optimizer]\nkind = \"sgd\"\nlr = 0.5\n";
}

TEST(Limits, TableEntriesAreNamedPositiveAndReasoned) {
  std::set<std::string_view> keys;
  ASSERT_GE(limits_table().size(), 10u);
  for (const Limit& l : limits_table()) {
    EXPECT_TRUE(keys.insert(l.key).second) << "duplicate " << l.key;
    EXPECT_GT(l.value, 0) << l.key;
    EXPECT_FALSE(l.unit.empty()) << l.key;
    EXPECT_GT(l.reason.size(), 20u) << l.key;
    EXPECT_EQ(limit(l.key), l.value) << l.key;
  }
  for (const char* k : {"samples", "parameters", "layers", "width", "windows",
                        "oracle_madds", "csv_bytes", "trace_bytes"})
    EXPECT_TRUE(keys.count(k)) << k;
  EXPECT_THROW(limit("no-such-limit"), std::logic_error);
}

TEST(Limits, CheckedArithmeticRefusesOverflow) {
  // The SIGSEGV of issue 9: 4611686018427387905 samples x 4 inputs wrapped
  // to 4 floats.
  EXPECT_FALSE(checked_mul(4611686018427387905, 4));
  EXPECT_FALSE(checked_mul(kMax, 2));
  EXPECT_FALSE(checked_add(kMax, 1));
  EXPECT_FALSE(checked_mul(-1, 2));
  EXPECT_EQ(checked_mul(3037000499, 3037000499), 3037000499 * 3037000499);
  EXPECT_EQ(checked_add(kMax - 1, 1), kMax);
}

TEST(Limits, ScenarioSizeOfTheFlagship) {
  const Scenario s =
      parse_scenario_file(::accumcheck::testing_util::source_dir() +
                          "/scenarios/zero-grad-every-micro-step.toml");
  const ScenarioSize z = scenario_size(s);
  EXPECT_EQ(z.parameters, 4 * 16 + 16 + 16 * 2 + 2);  // 114
  EXPECT_EQ(z.data_values, 64 * (4 + 2));
  EXPECT_EQ(z.windows_per_epoch, 4);  // 16 micro-batches of 4, K = 4
  EXPECT_EQ(z.windows, 16);           // 4 epochs
  EXPECT_EQ(z.samples_seen, 16 * 16);
  EXPECT_EQ(z.oracle_madds, 114 * 12 * 256);
  EXPECT_NO_THROW(require_scenario_within_limits(s));
}

TEST(Limits, MaxStepsCapsWindowsAndOverflowIsRefused) {
  Scenario s = parse_scenario_string(
      scenario_text(
          "micro_batch = 4\naccumulation = 2\nepochs = 1000000000000"),
      "big.toml");
  EXPECT_EQ(scenario_size(s).windows, int64_t(8) * 1000000000000);
  try {
    require_scenario_within_limits(s);
    FAIL() << "1e12 epochs accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "batching.epochs");
    EXPECT_NE(std::string(e.what()).find("8000000000000 optimizer windows "
                                         "exceeds the limit windows = 1000000"),
              std::string::npos)
        << e.what();
  }
  s.batching.max_steps = 1;  // --steps 1
  EXPECT_EQ(scenario_size(s).windows, 1);
  EXPECT_NO_THROW(require_scenario_within_limits(s));

  s.batching.epochs = kMax;
  s.batching.max_steps = -1;
  EXPECT_FALSE(scenario_size(s).windows);  // does not fit in 63 bits
  EXPECT_THROW(require_scenario_within_limits(s), InputError);
  s.batching.max_steps = 2;
  EXPECT_EQ(scenario_size(s).windows, 2);
}

TEST(Limits, OracleWorkLimitDependsOnTheBoundArithmetic) {
  // 1M-parameter-sized work: over the 50-digit oracle's limit, within the
  // double-double bound's (certify's default).
  Scenario s = parse_scenario_string(
      scenario_text("micro_batch = 4\naccumulation = 2\nepochs = 10"),
      "big.toml");
  s.model.widths = {64, 512, 512, 10};  // 301066 parameters
  s.batching.max_steps = 1;
  const int64_t per_step = *scenario_size(s).oracle_madds;
  s.batching.max_steps = limit("oracle_madds") / per_step + 1;
  ASSERT_LE(s.batching.max_steps, limit("windows"));
  s.batching.epochs = s.batching.max_steps;
  try {
    require_scenario_within_limits(s);
    FAIL() << "over oracle_madds accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit oracle_madds ="),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(require_scenario_within_limits(s, "oracle_madds_dd"));
  s.batching.max_steps = limit("oracle_madds_dd") / per_step + 1;
  s.batching.epochs = s.batching.max_steps;
  ASSERT_LE(s.batching.max_steps, limit("windows"));
  try {
    require_scenario_within_limits(s, "oracle_madds_dd");
    FAIL() << "over oracle_madds_dd accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit oracle_madds_dd ="),
              std::string::npos)
        << e.what();
  }
}

TEST(Limits, RequireWithinNamesKeyValueLimitAndTheWayToRaiseIt) {
  try {
    require_within("samples", 20000000, "data.samples = 20000000", "f.toml", 7,
                   11, "data.samples");
    FAIL() << "no throw";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.file(), "f.toml");
    EXPECT_EQ(e.line(), 7);
    EXPECT_NE(m.find("data.samples = 20000000 exceeds the limit samples = "
                     "10000000"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("ACCUMCHECK_LIMITS=samples=N"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(require_within("samples", 10000000, "x", "f", 0, 0, "k"));
  EXPECT_THROW(require_within("samples", std::nullopt, "x", "f", 0, 0, "k"),
               InputError);
}

TEST(Limits, EnvironmentRaisesAndLowersLimits) {
  {
    EnvGuard g("samples=5, windows=2.5e3,oracle_madds=1e12");
    EXPECT_EQ(limit("samples"), 5);
    EXPECT_EQ(limit("windows"), 2500);
    EXPECT_EQ(limit("oracle_madds"), 1000000000000);
    EXPECT_EQ(limit("layers"), 32);  // untouched
    EXPECT_THROW(parse_scenario_string(scenario_text("micro_batch = 4\n"
                                                     "accumulation = 2"),
                                       "s.toml"),
                 InputError);
  }
  for (const char* bad : {"samples", "samples=0", "samples=-1", "samples=1.5",
                          "sample=3", "samples=1e30"}) {
    EnvGuard g(bad);
    EXPECT_THROW(limit("samples"), InputError) << bad;
  }
  EXPECT_EQ(limit("samples"), 10000000);
}

TEST(Limits, FilesAreCheckedBeforeTheyAreRead) {
  // /dev/zero used to be read for 45 s (1.2 GB) before failing.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(require_file_within_limit("/dev/zero", "csv_bytes"), InputError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_THROW(require_file_within_limit("/", "csv_bytes"), InputError);
  const std::string scenario =
      ::accumcheck::testing_util::source_dir() + "/scenarios/correct.toml";
  EXPECT_NO_THROW(require_file_within_limit(scenario, "scenario_bytes"));
  EnvGuard g("scenario_bytes=10");
  EXPECT_THROW(require_file_within_limit(scenario, "scenario_bytes"),
               InputError);
}

TEST(Plan, LazyPlanBuildsEpochsOnlyWhenTheyRun) {
  Scenario s = parse_scenario_string(
      scenario_text("micro_batch = 4\naccumulation = 2\nepochs = "
                    "1000000000000\nmax_steps = 3"),
      "big.toml");
  const auto t0 = std::chrono::steady_clock::now();
  const Plan p = make_plan(s);
  EXPECT_TRUE(p.epochs.empty());
  EXPECT_EQ(p.epoch_count(), 1000000000000);
  EXPECT_EQ(p.windows(), int64_t(8) * 1000000000000);
  NullEngine e;
  TrainerOptions opt;
  opt.max_steps = s.batching.max_steps;
  Trainer<NullEngine> t(e, s, behavior_of({}), 0.5, opt);
  const accumcheck::Run<double> run = t.run(p, "x");
  EXPECT_EQ(run.steps.size(), 3u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(Plan, LazyEpochsEqualTheMaterializedOnes) {
  const Scenario s = parse_scenario_string(
      scenario_text("micro_batch = 3\naccumulation = 2\nepochs = 3\nranks = 2",
                    "samples = 23\nseed = 9"),
      "s.toml");
  const Plan lazy = make_plan(s);
  const Plan eager = materialize(lazy);
  ASSERT_EQ(eager.epochs.size(), 3u);
  const Plan big_lazy = as_large_batch(lazy);
  const Plan big_eager = as_large_batch(eager);
  EXPECT_EQ(big_lazy.windows(), big_eager.windows());
  for (int64_t e = 0; e < 3; ++e) {
    const EpochPlan a = lazy.epoch(e), b = big_lazy.epoch(e);
    ASSERT_EQ(a.windows.size(), eager.epochs[size_t(e)].windows.size());
    for (size_t w = 0; w < a.windows.size(); ++w) {
      const Window& x = a.windows[w];
      const Window& y = eager.epochs[size_t(e)].windows[w];
      EXPECT_EQ(x.partial, y.partial);
      ASSERT_EQ(x.micro.size(), y.micro.size());
      for (size_t m = 0; m < x.micro.size(); ++m)
        EXPECT_EQ(x.micro[m].shards, y.micro[m].shards);
      ASSERT_EQ(b.windows[w].micro.size(), 1u);
      EXPECT_EQ(b.windows[w].micro[0].shards,
                big_eager.epochs[size_t(e)].windows[w].micro[0].shards);
    }
  }
}

TEST(TrainerLimits, MaxWindowsEndsARunThatNeverSteps) {
  // partial-cycle-drop with fewer micro-batches than K in an epoch never
  // steps: without a window cap a long plan would be walked to its end.
  Scenario s = parse_scenario_string(
      scenario_text("micro_batch = 4\naccumulation = 4\nepochs = 1000000000000",
                    "samples = 12"),
      "s.toml");
  NullEngine e;
  TrainerOptions opt;
  opt.max_windows = 5;
  Trainer<NullEngine> t(e, s, behavior_of({Pitfall::partial_cycle_drop}), 0.5,
                        opt);
  const accumcheck::Run<double> run = t.run(make_plan(s), "x");
  EXPECT_TRUE(run.steps.empty());
  EXPECT_EQ(run.windows.size(), 5u);
}

TEST(CsvLines, SplitsInPlaceWithLineNumbers) {
  std::string bytes = "a,b\r\n1,2\n\n3,4";  // CRLF, an empty line, no end
  CsvLines in(bytes);
  std::vector<std::string> got;
  std::vector<int64_t> lines;
  while (char* l = in.next()) {
    got.emplace_back(l);
    lines.push_back(in.line());
  }
  EXPECT_EQ(got, (std::vector<std::string>{"a,b", "1,2", "", "3,4"}));
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 2, 3, 4}));
  std::string empty;
  CsvLines none(empty);
  EXPECT_EQ(none.next(), nullptr);
}

}  // namespace
}  // namespace accumcheck
