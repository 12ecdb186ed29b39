// Scenario files: every error names file:line:column, the dotted key and
// what was expected; to_toml round-trips; describe() is complete.
#include "sim/scenario_parse.hpp"

#include <gtest/gtest.h>

#include <string>

#include "sim/errors.hpp"
#include "tests/scenario_test_util.hpp"
#include "tests/source_dir.hpp"

namespace accumcheck {
namespace {

// Line numbers below refer to this text.
const std::string kBase = R"(story = "demo"

[model]
widths = [4, 8, 3]
activation = "tanh"
loss = "mse"

[data]
samples = 20
seed = 1

[batching]
micro_batch = 3
accumulation = 4

[optimizer]
kind = "adam"
lr = 0.001

[schedule]
kind = "cosine"
warmup = 2
total = 10

[clip]
max_norm = 1.0

[trainer]
pitfalls = ["zero-grad-never"]
)";

using testing_util::with;

// Parses `text` expecting an InputError at line:column with `key`, whose
// message contains `needle`.
void expect_error(const std::string& text, int64_t line, int64_t column,
                  const std::string& key, const std::string& needle) {
  testing_util::expect_scenario_error(text, line, key, needle, column,
                                      "dir/s.toml");
}

void expect_same(const Scenario& a, const Scenario& b) {
  EXPECT_EQ(a.story, b.story);
  EXPECT_EQ(a.model.widths, b.model.widths);
  EXPECT_EQ(a.model.activation, b.model.activation);
  EXPECT_EQ(a.model.loss, b.model.loss);
  EXPECT_EQ(a.data.source, b.data.source);
  EXPECT_EQ(a.data.samples, b.data.samples);
  EXPECT_EQ(a.data.dyadic, b.data.dyadic);
  EXPECT_EQ(a.data.csv_path, b.data.csv_path);
  EXPECT_EQ(a.data.seed, b.data.seed);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.batching.micro_batch, b.batching.micro_batch);
  EXPECT_EQ(a.batching.accumulation, b.batching.accumulation);
  EXPECT_EQ(a.batching.epochs, b.batching.epochs);
  EXPECT_EQ(a.batching.ranks, b.batching.ranks);
  EXPECT_EQ(a.batching.max_steps, b.batching.max_steps);
  EXPECT_EQ(a.optimizer.kind, b.optimizer.kind);
  EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
  EXPECT_EQ(a.optimizer.momentum, b.optimizer.momentum);
  EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_EQ(a.optimizer.eps, b.optimizer.eps);
  EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_EQ(a.optimizer.l2_in_loss, b.optimizer.l2_in_loss);
  EXPECT_EQ(a.schedule.kind, b.schedule.kind);
  EXPECT_EQ(a.schedule.warmup, b.schedule.warmup);
  EXPECT_EQ(a.schedule.total, b.schedule.total);
  EXPECT_EQ(a.schedule.step_size, b.schedule.step_size);
  EXPECT_EQ(a.schedule.gamma, b.schedule.gamma);
  EXPECT_EQ(a.clip.enabled, b.clip.enabled);
  EXPECT_EQ(a.clip.max_norm, b.clip.max_norm);
  EXPECT_EQ(a.trainer.pitfalls, b.trainer.pitfalls);
  EXPECT_EQ(a.trainer.accepted, b.trainer.accepted);
  EXPECT_EQ(a.trainer.lr_scaling, b.trainer.lr_scaling);
  EXPECT_EQ(a.expect.kind, b.expect.kind);
  EXPECT_EQ(a.expect.min_distance, b.expect.min_distance);
  EXPECT_EQ(a.expect.at_step, b.expect.at_step);
}

TEST(ScenarioParse, BaseParses) {
  const Scenario s = parse_scenario_string(kBase, "dir/zero-grad.toml");
  EXPECT_EQ(s.name, "zero-grad");
  EXPECT_EQ(s.path, "dir/zero-grad.toml");
  EXPECT_EQ(s.story, "demo");
  EXPECT_EQ(s.digest, digest_hex(kBase));
  EXPECT_EQ(s.digest.size(), 16u);
  EXPECT_EQ(s.model.widths, (std::vector<int64_t>{4, 8, 3}));
  EXPECT_EQ(s.data.samples, 20);
  EXPECT_EQ(s.data.seed, 1u);
  EXPECT_TRUE(s.data.shuffle);
  EXPECT_EQ(s.batching.micro_batch, 3);
  EXPECT_EQ(s.batching.accumulation, 4);
  EXPECT_EQ(s.batching.epochs, 1);
  EXPECT_EQ(s.batching.max_steps, -1);
  EXPECT_EQ(s.optimizer.kind, OptimizerKind::adam);
  EXPECT_EQ(s.optimizer.lr, 0.001);
  EXPECT_EQ(s.schedule.kind, ScheduleKind::cosine);
  EXPECT_EQ(s.schedule.warmup, 2);
  EXPECT_EQ(s.schedule.total, 10);
  EXPECT_TRUE(s.clip.enabled);
  EXPECT_EQ(s.clip.max_norm, 1.0);
  EXPECT_EQ(s.trainer.pitfalls, std::vector<Pitfall>{Pitfall::zero_grad_never});
  EXPECT_TRUE(s.trainer.accepted.empty());
  EXPECT_EQ(s.expect.kind, ExpectKind::matches_reference);
  EXPECT_EQ(describe(s),
            "mlp(4-8-3,tanh,mse) n=20 seed=1 b=3 K=4 R=1 adam lr=0.001 "
            "betas=(0.9,0.999) eps=1e-08 cosine(w=2,T=10) clip=1 "
            "zero-grad-never");
}

TEST(ScenarioParse, DigestIsFnv1a64) {
  EXPECT_EQ(digest_hex(""), "cbf29ce484222325");
  EXPECT_EQ(digest_hex("a"), "af63dc4c8601ec8c");
}

TEST(ScenarioParse, OutOfRangeInteger) {
  expect_error(with(kBase, "accumulation = 4", "accumulation = 0"), 14, 16,
               "batching.accumulation", "expected an integer >= 1, got 0");
}

TEST(ScenarioParse, WrongType) {
  expect_error(with(kBase, "accumulation = 4", "accumulation = 4.0"), 14, 16,
               "batching.accumulation",
               "expected an integer >= 1, an array of one K per epoch, or a "
               "ramp { start, step, max }, got 4.0");
  expect_error(with(kBase, "lr = 0.001", "lr = \"fast\""), 18, 6,
               "optimizer.lr", "expected a number > 0, got \"fast\"");
}

TEST(ScenarioParse, TypoedKey) {
  expect_error(with(kBase, "accumulation = 4", "acumulation = 4"), 14, 1,
               "batching.acumulation",
               "unknown key 'acumulation' in [batching]; did you mean "
               "'accumulation'?");
}

TEST(ScenarioParse, TypoedSection) {
  expect_error(with(kBase, "[optimizer]", "[optimiser]"), 16, 2, "optimiser",
               "unknown section [optimiser]; did you mean [optimizer]?");
}

TEST(ScenarioParse, BadPitfallId) {
  expect_error(
      with(kBase, "\"zero-grad-never\"", "\"zero-grad-every-microstep\""), 29,
      13, "trainer.pitfalls[0]",
      "unknown pitfall id 'zero-grad-every-microstep'; did you mean "
      "'zero-grad-every-micro-step'? Known ids: "
      "no-loss-normalization, ");
}

TEST(ScenarioParse, BadChoice) {
  expect_error(with(kBase, "\"tanh\"", "\"tahn\""), 5, 14, "model.activation",
               "expected one of \"tanh\", \"relu\", \"gelu\", \"identity\", "
               "got \"tahn\"; did you mean \"tanh\"?");
}

TEST(ScenarioParse, MissingKeyPointsAtItsSection) {
  expect_error(with(kBase, "lr = 0.001\n", ""), 16, 1, "optimizer.lr",
               "missing required key 'lr'; expected a number > 0");
}

TEST(ScenarioParse, MissingSectionIsLineZero) {
  std::string text = with(kBase, "[batching]\nmicro_batch = 3\n", "");
  text = with(text, "accumulation = 4\n", "");
  expect_error(text, 0, 0, "batching.micro_batch",
               "missing required key 'micro_batch'");
  expect_error(with(kBase, "story = \"demo\"\n", ""), 0, 0, "story",
               "missing required key 'story'");
}

TEST(ScenarioParse, SyntaxError) {
  expect_error(with(kBase, "samples = 20", "samples = "), 9, 11, "",
               "TOML syntax error");
}

TEST(ScenarioParse, CrossFieldChecks) {
  expect_error(with(kBase, "micro_batch = 3", "micro_batch = 21"), 13, 15,
               "batching.micro_batch",
               "expected an integer in 1..20 (data.samples), got 21");
  std::string ce = with(kBase, "[4, 8, 3]", "[4, 8, 1]");
  expect_error(with(ce, "\"mse\"", "\"cross-entropy\""), 6, 8, "model.loss",
               "cross-entropy needs d_out >= 2");
  expect_error(with(kBase, "total = 10", "total = 2"), 23, 9, "schedule.total",
               "expected an integer > schedule.warmup = 2, got 2");
  expect_error(with(kBase, "lr = 0.001", "lr = 0.001\nmomentum = 0.9"), 19, 12,
               "optimizer.momentum", "applies to kind = \"sgd\" only");
  expect_error(with(kBase, "[4, 8, 3]", "[4]"), 4, 10, "model.widths",
               "expected an array of >= 2 layer widths");
  expect_error(with(kBase, "[4, 8, 3]", "[4, 8, 5000]"), 4, 17,
               "model.widths[2]",
               "model.widths[2] = 5000 exceeds the limit width = 4096");
  expect_error(with(kBase, "max_norm = 1.0", "max_norm = -1.0"), 26, 12,
               "clip.max_norm", "expected a number > 0, got -1.0");
  expect_error(with(kBase, "max_norm = 1.0", "max_norm = inf"), 26, 12,
               "clip.max_norm", "expected a number > 0, got inf");
}

TEST(ScenarioParse, ExpectDiverges) {
  const std::string text =
      kBase + "\n[expect]\nverdict = \"diverges-from-reference\"\n";
  expect_error(text, 31, 1, "expect.min_distance",
               "missing required key 'min_distance'; expected a number > 0");
  const Scenario s = parse_scenario_string(
      text + "min_distance = 0.05\nat_step = 1\n", "x.toml");
  EXPECT_EQ(s.expect.kind, ExpectKind::diverges_from_reference);
  EXPECT_EQ(s.expect.min_distance, 0.05);
  EXPECT_EQ(s.expect.at_step, 1);
  // Beyond the run's windows: refused (it used to be judged on NaN).
  expect_error(text + "min_distance = 0.05\nat_step = 3\n", 34, 11,
               "expect.at_step",
               "expected a window in 0..1 (the run has 2 windows: 1 epochs x "
               "2 per epoch), got 3");
  expect_error(kBase + "\n[expect]\nmin_distance = 0.05\n", 32, 16,
               "expect.min_distance", "applies to verdict");
}

TEST(ScenarioParse, DuplicatePitfall) {
  expect_error(with(kBase, "[\"zero-grad-never\"]",
                    "[\"zero-grad-never\", \"zero-grad-never\"]"),
               29, 32, "trainer.pitfalls[1]", "listed twice");
}

TEST(ScenarioParse, RoundTrip) {
  const std::string variants[] = {
      kBase,
      with(with(kBase, "lr = 0.001",
                "lr = 0.30000000000000004\nbeta1 = 0.8\nbeta2 = 0.99\n"
                "eps = 1e-7\nweight_decay = 0.01"),
           "kind = \"adam\"", "kind = \"adamw\""),
      with(with(with(kBase, "kind = \"adam\"", "kind = \"sgd\""), "lr = 0.001",
                "lr = 1\nmomentum = 0.9\nl2_in_loss = 1e-4"),
           "kind = \"cosine\"\nwarmup = 2\ntotal = 10",
           "kind = \"step\"\nstep_size = 3\ngamma = 0.7"),
      kBase +
          "\n[expect]\nverdict = \"diverges-from-reference\"\n"
          "min_distance = 0.1\n",
      with(with(kBase, "seed = 1",
                "seed = 12345678901\ndyadic = true\n"
                "shuffle = false"),
           "pitfalls = [\"zero-grad-never\"]",
           "pitfalls = [\"partial-cycle-drop\", \"scheduler-per-micro-step\"]"
           "\naccepted = [\"partial-cycle-drop\"]\nlr_scaling = \"sqrt\""),
      "story = \"quote \\\" and \\\\ and tab\\t\"\n[model]\nwidths = [3, 2]\n"
      "loss = \"cross-entropy\"\n[data]\nsamples = 5\n[batching]\n"
      "micro_batch = 2\naccumulation = 1\nranks = 2\nmax_steps = 3\n"
      "[optimizer]\nlr = 0.1\n",
  };
  for (const std::string& text : variants) {
    const Scenario a = parse_scenario_string(text, "a.toml");
    const std::string written = to_toml(a);
    const Scenario b = parse_scenario_string(written, "a.toml");
    SCOPED_TRACE(written);
    expect_same(a, b);
    EXPECT_EQ(to_toml(b), written);
  }
}

TEST(ScenarioParse, CsvFileScenario) {
  const std::string dir =
      ::accumcheck::testing_util::source_dir() + "/tests/data";
  const Scenario s = parse_scenario_file(dir + "/tiny_mse.toml");
  EXPECT_EQ(s.name, "tiny_mse");
  EXPECT_EQ(s.data.source, DataSource::csv);
  EXPECT_EQ(s.data.csv_path, dir + "/tiny_mse.csv");
  EXPECT_EQ(s.data.samples, 4);
  const Scenario b = parse_scenario_string(to_toml(s), "elsewhere/b.toml");
  expect_same(s, b);

  // samples must agree with the file's rows.
  try {
    parse_scenario_string(
        "story = \"x\"\n[model]\nwidths = [2, 1]\n[data]\ncsv = "
        "\"tiny_mse.csv\"\nsamples = 5\n[batching]\nmicro_batch = 1\n"
        "accumulation = 1\n[optimizer]\nlr = 0.1\n",
        dir + "/inline.toml");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.line(), 6);
    EXPECT_EQ(e.key(), "data.samples");
  }
  // The CSV header must match the model.
  try {
    parse_scenario_string(
        "story = \"x\"\n[model]\nwidths = [3, 1]\n[data]\ncsv = "
        "\"tiny_mse.csv\"\n[batching]\nmicro_batch = 1\n"
        "accumulation = 1\n[optimizer]\nlr = 0.1\n",
        dir + "/inline.toml");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), dir + "/tiny_mse.csv");
    EXPECT_EQ(e.line(), 1);
    EXPECT_NE(std::string(e.what()).find("x0,x1,x2,y0"), std::string::npos)
        << e.what();
  }
}

TEST(ScenarioParse, MissingFile) {
  try {
    parse_scenario_file("/nonexistent/nope.toml");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "/nonexistent/nope.toml");
    EXPECT_EQ(e.line(), 0);
  }
}

}  // namespace
}  // namespace accumcheck
