// A trainer whose K is not the declared one (issue 42, part 6): the
// evidence says the run's windows disagree with the declared K and names
// the K the run looks like, in the oracle tier (a float32 run at K = 2
// certified against the scenario's K = 4) and in the contract tier (a
// recorded run at K = 2 whose recorder was told K = 4).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "certify_test_util.hpp"
#include "gpu/device.hpp"
#include "gpu/emulated.hpp"
#include "sim/data.hpp"
#include "sim/experiment.hpp"
#include "sim/layout.hpp"
#include "tests/source_dir.hpp"
#include "verify/certify/certify.hpp"
#include "verify/certify/evidence.hpp"
#include "verify/contract/contract.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {
namespace {

using certify_test::scenario;

TEST(WindowsK, NamesTheOneSizeOfEveryEpochsWindows) {
  // Two epochs of windows 2, 2, 2, 1 (a partial last window), declared 4.
  std::vector<RunWindow> w;
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t n : {2, 2, 2, 1}) w.push_back({e, n, 4});
  EXPECT_EQ(windows_k(w), 2);
  const std::string line = windows_evidence(w, "the recorder was told");
  EXPECT_EQ(line,
            "windows: each of the 8 optimizer steps closes a window of 2 "
            "micro-batches (each epoch's last at most 2), and the "
            "recorder was told K = 4: the run looks like K = 2");
  // The declared K itself: nothing to say.
  for (auto& x : w) x.declared = 2;
  EXPECT_EQ(windows_k(w), 0);
  EXPECT_EQ(windows_evidence(w, "x"), "");
}

TEST(WindowsK, NoOneSizeNoK) {
  // A window of 3 among windows of 2: no one K (a pitfall's windows, or
  // a loop that steps irregularly; other evidence speaks).
  EXPECT_EQ(windows_k({{0, 2, 4}, {0, 3, 4}, {0, 2, 4}}), 0);
  // A last window longer than the others.
  EXPECT_EQ(windows_k({{0, 2, 4}, {0, 2, 4}, {0, 3, 4}}), 0);
  // Epochs that disagree.
  EXPECT_EQ(windows_k({{0, 2, 4}, {0, 2, 4}, {1, 3, 4}, {1, 3, 4}}), 0);
  // One window per epoch says nothing of K.
  EXPECT_EQ(windows_k({{0, 2, 4}, {1, 2, 4}}), 0);
  // A step with no backward pass since the one before it.
  EXPECT_EQ(windows_k({{0, 0, 4}, {0, 0, 4}}), 0);
}

TEST(WindowsK, ARampsDeclaredKPerEpoch) {
  // Declared K = 2 then 4; the run kept 2.
  const std::vector<RunWindow> w = {
      {0, 2, 2}, {0, 2, 2}, {1, 2, 4}, {1, 2, 4}, {1, 1, 4}};
  EXPECT_EQ(windows_k(w), 2);
  EXPECT_NE(windows_evidence(w, "the scenario declares")
                .find("the scenario declares K per epoch 2, 4: the run "
                      "looks like K = 2"),
            std::string::npos)
      << windows_evidence(w, "the scenario declares");
}

// A micro-batch backwarded twice (its sample ids again) is one micro-batch
// of its window: a double count is not a larger K (examples/oracle/
// train_double_count.py); a backward with no ids is one each.
TEST(WindowsK, ADoubleCountIsOneMicroBatch) {
  TraceRun run;
  auto ev = [&](EventKind k, std::vector<int64_t> ids) {
    Event e;
    e.kind = k;
    e.sample_ids = std::move(ids);
    run.events.push_back({e, 0});
  };
  for (int w = 0; w < 2; ++w) {
    ev(EventKind::forward_backward, {0, 1});
    ev(EventKind::forward_backward, {0, 1});
    ev(EventKind::forward_backward, {2, 3});
    ev(EventKind::forward_backward, {});
    ev(EventKind::forward_backward, {});
    ev(EventKind::optimizer_step, {});
  }
  Plan plan;
  plan.accumulation = 4;
  const std::vector<RunWindow> w = trace_windows(run, plan, 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].backward, 4);
  EXPECT_EQ(w[1].backward, 4);
  EXPECT_EQ(windows_k(w), 0);
}

// The float32 engine's run of certify-mlp at K = 2, written as a trace
// of the scenario as exported (K = 4, its digest): a trainer that read
// the bundle and used its own K.
std::string run_at_k(int64_t K) {
  Scenario run = scenario();
  run.batching.accumulation = K;
  return certify_test::device_trace_as(run, scenario(),
                                       "k" + std::to_string(K));
}

TEST(CertifyWindows, OracleTierNamesTheRunsK) {
  const CertifyReport r = certify(scenario(), run_at_k(2));
  ASSERT_FALSE(r.pass) << certify_text(r);
  const std::string text = certify_text(r);
  EXPECT_NE(r.diagnosis.find("no modelled pitfall"), std::string::npos) << text;
  EXPECT_NE(
      r.diagnosis.find(
          "no modelled pitfall explains this trace\nevidence: windows: each "
          "of the 15 optimizer steps closes a window of 2 micro-batches "
          "(each epoch's last at most 2), "
          "and the scenario declares K = 4: the run looks like K = 2\n"),
      std::string::npos)
      << text;
}

TEST(CertifyWindows, OracleTierSaysNothingOfKWhenTheWindowsAreK) {
  // Correct at K, and zero-grad-never (windows of K, a modelled
  // pitfall): no windows line in either.
  for (const auto& p : {std::vector<Pitfall>{},
                        std::vector<Pitfall>{Pitfall::zero_grad_never}}) {
    const CertifyReport r = certify(
        scenario(), certify_test::device_trace(
                        p.empty() ? "windows_correct" : "windows_zg", p));
    EXPECT_EQ(r.diagnosis.find("looks like K"), std::string::npos)
        << certify_text(r);
  }
}

const std::string kData = testing_util::source_dir() + "/tests/data/";

// tests/data/contract_k2_told_4: PyTorch 2.13.0 (CPU) recorded
// `python examples/contract/train.py --model cnn --optimizer sgd --K 2
// --told-K 4`: the Transformers-style loop at K = 2, its recorder told 4.
TEST(CertifyWindows, ContractTierNamesTheRunsK) {
  const CertifyReport r = certify_contract(kData + "contract_k2_told_4");
  const std::string text = contract_text(r);
  ASSERT_FALSE(r.pass) << text;
  EXPECT_NE(r.diagnosis.find("no modelled pitfall"), std::string::npos) << text;
  EXPECT_NE(r.diagnosis.find(
                "evidence: windows: each of the 8 optimizer steps closes a "
                "window of 2 micro-batches (each epoch's last at most "
                "2), and the recorder was told K = 4: the run looks like K = "
                "2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(r.diagnosis.find("evidence: with accumulation=2 told to the "
                             "recorder, the weights are correct's (max "),
            std::string::npos)
      << text;
  // The weights read against K = 4 (micro-batches "counted twice",
  // "skipped") are not said: K = 2 explains them.
  EXPECT_EQ(r.diagnosis.find("counted twice"), std::string::npos) << text;
}

// The same loop at K = 4 (tests/data/contract_clip_schedule: --K 4 --clip
// 0.5 --schedule linear) passes, with no word of K.
TEST(CertifyWindows, ContractTierCorrectRunSaysNothingOfK) {
  const CertifyReport r = certify_contract(kData + "contract_clip_schedule");
  EXPECT_TRUE(r.pass) << contract_text(r);
  EXPECT_EQ(contract_text(r).find("looks like K"), std::string::npos);
}

// ---- step-budget-drops-micro-batches names both of the budget's effects
// (issue 44): Transformers 4.45-4.51 stops at max_steps = epochs x
// (len(loader) // K) and builds its scheduler with num_training_steps =
// max_steps, so a cosine decays over the budget.  Before the trainer loop
// gave the candidate the budget's horizon, a run with a cosine FAILed with
// "no modelled lr pitfall" (step 3 at 0.0015 against 0.00256); certify
// names it now in both tiers.

// The oracle tier: scenarios/step-budget-drops-micro-batches-cosine.toml's
// float32 run (10 micro-batches an epoch, K = 4, a cosine whose warmup is
// a ratio of its horizon), certified against correct.
TEST(CertifyStepBudget, OracleTierNamesTheBudgetsHorizon) {
  const std::string file = testing_util::source_dir() +
                           "/scenarios/step-budget-drops-micro-batches-"
                           "cosine.toml";
  const Scenario s = parse_scenario_file(file);
  const CertifyReport r = certify(
      s,
      certify_test::device_trace(
          "budget_cosine", {Pitfall::step_budget_drops_micro_batches}, file));
  const std::string text = certify_text(r);
  ASSERT_FALSE(r.pass) << text;
  // Step 1: the warmup of ceil(0.25 x 4) = 1 step is over (S = 1) where
  // correct's ceil(0.25 x 6) = 2 is halfway (S = 0.5).
  EXPECT_NE(text.find("lr: step 1 used lr 0.02, the accepted schedule gives "
                      "0.01; the lr sequence is the schedule over a horizon "
                      "of 4 steps, not 6"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("diagnosis: matches step-budget-drops-micro-batches (max "),
      std::string::npos)
      << text;
}

// The contract tier on the new user's run itself (tests/data/
// contract_hf_4461_cosine: tests/data/hf_sft_4461.py, the user's trainer,
// under Transformers 4.46.1, torch 2.13.0 CPU, bf16: a tiny Llama on 37
// prompt-masked sequences in batches of 4, K = 4, 2 epochs, cosine with
// warmup_steps=2): 4 steps of 6, step 3 at S(3) over 4 steps.
TEST(CertifyStepBudget, ContractTierNamesTransformers4461Cosine) {
  const CertifyReport r = certify_contract(kData + "contract_hf_4461_cosine");
  const std::string text = contract_text(r);
  ASSERT_FALSE(r.pass) << text;
  EXPECT_NE(text.find("FAIL lr: step 3 used lr 0.0015, the accepted schedule "
                      "gives 0.00256066017: the lr sequence is the schedule "
                      "over a horizon of 4 steps, not 6"),
            std::string::npos)
      << text;
  EXPECT_NE(r.diagnosis.find(
                "diagnosis: matches skip-short-micro-batch+window-counter-"
                "across-epochs+items-counted-per-fetch-group+step-budget-"
                "drops-micro-batches (same weights: window-counter-across-"
                "epochs+items-counted-per-fetch-group+last-fetch-sized-in-"
                "samples+step-budget-drops-micro-batches)"),
            std::string::npos)
      << text;
}

// The same run with warmup_ratio=0.25 (contract_hf_4461_cosine_ratio): the
// Trainer's warmup is ceil(0.25 x 4) = 1 step, correct's ceil(0.25 x 6) =
// 2; the recorder writes the ratio (schedule_warmup_ratio) beside the
// warmup, and the candidate takes it of the budget.
TEST(CertifyStepBudget, ContractTierTakesTheWarmupRatioOfTheBudget) {
  const CertifyReport r =
      certify_contract(kData + "contract_hf_4461_cosine_ratio");
  const std::string text = contract_text(r);
  ASSERT_FALSE(r.pass) << text;
  EXPECT_NE(text.find("FAIL lr: step 1 used lr 0.003, the accepted schedule "
                      "gives 0.0015: the lr sequence is the schedule over a "
                      "horizon of 4 steps, not 6"),
            std::string::npos)
      << text;
  EXPECT_NE(r.diagnosis.find("step-budget-drops-micro-batches (same weights"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace accumcheck
