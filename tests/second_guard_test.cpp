// A second, independent guard for three details that one test each used
// to hold (a property in properties/ or plan_test):
//  - clip_grad_norm_'s coef = c / (norm + 1e-6): the Trainer's clipped
//    window gradient against the same window accumulated here on a bare
//    oracle and scaled by hand;
//  - BatchNorm's running variance is the UNBIASED batch variance
//    (ss / (b - 1)): one training forward on the oracle against the closed
//    form, and the float32 device engine against the oracle's bound;
//  - the per-epoch reshuffle: the sample order the Trainer actually feeds
//    the engine is a different permutation in every epoch (and the same
//    one when shuffle = false).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gpu/emulated.hpp"
#include "hole_test_util.hpp"
#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "oracle_test_util.hpp"
#include "sim/data.hpp"
#include "sim/layout.hpp"
#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "sim/trainer.hpp"
#include "tests/source_dir.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck {
namespace {

using R = OracleReal;
using TR = Tracked<R>;
namespace em = error_model;

const std::string kScenarios =
    ::accumcheck::testing_util::source_dir() + "/scenarios/";

// ------------------------------------------------------- clip's 1e-6

TEST(SecondGuard, ClipCoefficientHasTheEpsilonInItsDenominator) {
  Scenario s = parse_scenario_file(kScenarios + "correct.toml");
  s.trainer.pitfalls.clear();
  s.optimizer.l2_in_loss = 0;  // the window gradient is the losses' alone
  s.clip.enabled = true;
  const Dataset d = make_dataset(s);
  const std::vector<float> p = initial_parameters(s, layout_of(s.model));
  const Plan plan = materialize(make_plan(s));
  const Window& w = plan.epochs.at(0).windows.at(0);

  // The window accumulated on a bare oracle: correct weights 1/N_w.
  Oracle<R> bare(s.model, d, p);
  bare.zero_grad();
  for (const MicroBatch& m : w.micro)
    for (const auto& shard : m.shards)
      if (!shard.empty()) bare.forward_backward(shard, w.items());
  const std::vector<R> g = bare.grads();
  R norm2(0);
  for (const R& x : g) norm2 += x * x;
  const R norm = sqrt(norm2);
  // A max_norm below the norm, so that the window is clipped.
  s.clip.max_norm = 0.5 * static_cast<double>(norm);
  const R c(s.clip.max_norm);
  ASSERT_LT(c, norm);
  std::vector<R> want = g;
  const R coef = c / (norm + R(1e-6));
  for (R& x : want) x *= coef;

  // The epsilon must matter far above the tolerance, or this test could
  // not fail without it.
  const double tol = em::oracle_tolerance(oracle_digits());
  const R no_eps_gap = abs(R(c / norm - coef)) / coef;
  ASSERT_GT(no_eps_gap, R(1e6 * tol));

  const std::vector<R> got = hole_test::first_step_gradient(s, d, p);
  EXPECT_LE(hole_test::max_relative_difference(got, want), tol)
      << "the clipped gradient is not g * c / (|g| + 1e-6)";
}

// --------------------------------- BatchNorm's unbiased running variance

TEST(SecondGuard, BatchNormRunningVarianceIsUnbiased) {
  ModelSpec m = oracle_test::mlp({2, 3, 1}, Activation::tanh, LossKind::mse);
  m.norm = NormKind::batchnorm;
  const int64_t b = 4;
  const Dataset d = oracle_test::dataset(m, b, 5);
  const std::vector<float> p = oracle_test::params(m, 6);
  const ParamLayout L = layout_of(m);
  const std::vector<int64_t> ids = oracle_test::iota_ids(0, b);

  // By hand: z = W x + bias per hidden unit, then 0.9 * 1 + 0.1 * ss/(b-1).
  const TensorView& W = L.tensors[L.linear[0]];
  const TensorView& B = L.tensors[L.linear[0] + 1];
  std::vector<R> want;
  for (int64_t j = 0; j < 3; ++j) {
    std::vector<R> z;
    for (int64_t id : ids) {
      R acc = R(p[size_t(B.offset + j)]);
      for (int64_t i = 0; i < 2; ++i)
        acc += R(p[size_t(W.offset + j * 2 + i)]) * R(d.input(id)[i]);
      z.push_back(acc);
    }
    const R mean = std::accumulate(z.begin(), z.end(), R(0)) / R(b);
    R ss(0);
    for (const R& v : z) ss += (v - mean) * (v - mean);
    const R momentum(0.1);  // PyTorch's default, as a float32 engine has it
    want.push_back((R(1) - momentum) * R(1) + momentum * (ss / R(b - 1)));
  }

  Oracle<R> o(m, d, p);
  o.forward_backward(ids, b);
  const TensorView& rv = L.running_var(0);
  std::vector<R> got(o.buffers().begin() + rv.offset,
                     o.buffers().begin() + rv.offset + rv.size());
  EXPECT_LE(hole_test::max_relative_difference(got, want),
            em::oracle_tolerance(oracle_digits()))
      << "running_var is not (1 - m) + m * ss / (b - 1)";

  // The float32 engine against the oracle's bound on the same buffers.
  Oracle<TR> tracked(m, d, p);
  tracked.forward_backward(ids, b);
  EmulatedDevice dev(m, d, p);
  dev.forward_backward(ids, b);
  const std::vector<float> fb = dev.state().buffers;
  const std::vector<TR> tb = tracked.state().buffers;
  const std::vector<float> f(fb.begin() + rv.offset,
                             fb.begin() + rv.offset + rv.size());
  const std::vector<TR> t(tb.begin() + rv.offset,
                          tb.begin() + rv.offset + rv.size());
  const em::Comparison c = em::compare("device running_var", f, t);
  EXPECT_TRUE(c.ok()) << c.summary();
}

// ------------------------------------------------ the per-epoch reshuffle

// NullEngine that records the sample ids of every forward_backward.
struct RecordingEngine : NullEngine {
  std::vector<int64_t> fed;
  double forward_backward(const std::vector<int64_t>& ids, LossWeight) {
    fed.insert(fed.end(), ids.begin(), ids.end());
    return 0;
  }
};
static_assert(Engine<RecordingEngine>);

// The ids the Trainer feeds the engine over the whole run, cut into
// epochs (one rank: each epoch feeds every sample once).
std::vector<std::vector<int64_t>> fed_per_epoch(const Scenario& s) {
  EXPECT_EQ(s.batching.ranks, 1);
  RecordingEngine e;
  Trainer<RecordingEngine> t(e, s, behavior_of({}), base_lr(s));
  t.run(make_plan(s), "correct");
  const size_t n = size_t(s.data.samples);
  EXPECT_EQ(e.fed.size(), n * size_t(s.batching.epochs));
  std::vector<std::vector<int64_t>> out;
  for (size_t at = 0; at + n <= e.fed.size(); at += n)
    out.emplace_back(e.fed.begin() + long(at), e.fed.begin() + long(at + n));
  return out;
}

TEST(SecondGuard, TrainerSeesANewPermutationEveryEpoch) {
  Scenario s =
      parse_scenario_file(kScenarios + "zero-grad-every-micro-step.toml");
  s.data.shuffle = true;
  s.batching.epochs = 4;
  const auto fed = fed_per_epoch(s);
  ASSERT_EQ(fed.size(), 4u);
  std::vector<int64_t> all(size_t(s.data.samples));
  std::iota(all.begin(), all.end(), 0);
  std::set<std::vector<int64_t>> distinct;
  for (size_t ep = 0; ep < fed.size(); ++ep) {
    std::vector<int64_t> sorted = fed[ep];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all) << "epoch " << ep << " is not a permutation";
    EXPECT_NE(fed[ep], all) << "epoch " << ep << " is not shuffled";
    distinct.insert(fed[ep]);
  }
  EXPECT_EQ(distinct.size(), fed.size())
      << "two epochs fed the samples in the same order: no reshuffle";

  s.data.shuffle = false;
  for (const auto& order : fed_per_epoch(s))
    EXPECT_EQ(order, all) << "shuffle = false must keep the file order";
}

}  // namespace
}  // namespace accumcheck
