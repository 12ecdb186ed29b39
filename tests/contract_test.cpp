// The contract tier's coefficient engine
// (verify/contract/coefficient_engine.hpp): exact weights for hand-checkable
// windows, the property over the oracle for every catalog pitfall and pair, and
// that property broken on purpose.
#include "properties/contract.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/generators.hpp"
#include "properties/harness.hpp"
#include "sim/plan.hpp"
#include "sim/trainer.hpp"
#include "verify/contract/coefficient_engine.hpp"

namespace accumcheck {
namespace {

using contract::CoefficientEngine;
using contract::Rational;
using contract::Term;

Scenario small(int64_t n, int64_t b, int64_t K) {
  Scenario s;
  s.name = "t";
  s.story = "t";
  s.model.widths = {2, 1};
  s.data.samples = n;
  s.data.shuffle = false;
  s.batching.micro_batch = b;
  s.batching.accumulation = K;
  s.batching.epochs = 1;
  return s;
}

// The weights of each step, as "j:w" strings over the grad terms.
std::vector<std::string> weights(const Scenario& s, std::vector<Pitfall> p) {
  CoefficientEngine e(
      [](const std::vector<int64_t>& ids) { return int64_t(ids.size()); });
  Trainer<CoefficientEngine> t(e, s, behavior_of(p), s.optimizer.lr);
  t.run(make_plan(s), "x");
  std::vector<std::string> out;
  for (const auto& st : e.steps()) {
    std::string line;
    for (const auto& [term, c] : st.grad)
      line += (line.empty() ? "" : " ") + std::to_string(term.index) + ":" +
              c.str();
    out.push_back(line);
  }
  return out;
}

TEST(Contract, CorrectWeighsEverySampleOnce) {
  // n = 10, b = 3: micro-batches 3,3,3,1; K = 2: windows {3,3}, {3,1}.
  EXPECT_EQ(weights(small(10, 3, 2), {}),
            (std::vector<std::string>{"0:1/6 1:1/6", "2:1/4 3:1/4"}));
}

TEST(Contract, PitfallWeights) {
  const Scenario s = small(10, 3, 2);
  EXPECT_EQ(weights(s, {Pitfall::sample_mean_of_means}),
            (std::vector<std::string>{"0:1/6 1:1/6", "2:1/6 3:1/2"}));
  EXPECT_EQ(weights(s, {Pitfall::zero_grad_every_micro_step}),
            (std::vector<std::string>{"1:1/6", "3:1/4"}));
  EXPECT_EQ(
      weights(s, {Pitfall::zero_grad_never}),
      (std::vector<std::string>{"0:1/6 1:1/6", "0:1/6 1:1/6 2:1/4 3:1/4"}));
  EXPECT_EQ(weights(s, {Pitfall::no_loss_normalization}),
            (std::vector<std::string>{"0:1/3 1:1/3", "2:1/3 3:1"}));
  EXPECT_EQ(weights(s, {Pitfall::skip_short_micro_batch}),
            (std::vector<std::string>{"0:1/6 1:1/6", "2:1/3"}));
}

TEST(Contract, ClipIsARecordedSymbol) {
  Scenario s = small(8, 2, 2);
  s.clip.enabled = true;
  s.clip.max_norm = 0.5;
  EXPECT_EQ(weights(s, {Pitfall::clip_per_micro_step}),
            (std::vector<std::string>{"0:1/4*s0*s1 1:1/4*s1",
                                      "2:1/4*s2*s3 3:1/4*s3"}));
}

// ddp-clip-local-norm on a sharded trace: each rank's step holds correct's
// weights times a symbol of its own, valued by the norm of its chunk of
// ceil(n/R) elements (the oracle trainer's cut); correct's clip is one
// symbol per rank too, on the whole gradient's norm.
TEST(Contract, ShardClipIsTheRanksOwnSymbol) {
  Scenario s = small(16, 2, 2);  // 8 samples a rank: 2 windows of 2
  s.clip.enabled = true;
  s.clip.max_norm = 0.5;
  s.batching.ranks = 2;
  for (const bool local : {false, true}) {
    CoefficientEngine e(
        [](const std::vector<int64_t>& ids) { return int64_t(ids.size()); });
    Trainer<CoefficientEngine> t(
        e, s,
        behavior_of(local ? std::vector<Pitfall>{Pitfall::ddp_clip_local_norm}
                          : std::vector<Pitfall>{}),
        s.optimizer.lr);
    t.run(make_plan(s), "x");
    ASSERT_EQ(e.clips().size(), 4u);  // 2 steps x 2 ranks
    for (size_t m = 0; m < e.clips().size(); ++m) {
      EXPECT_EQ(e.clips()[m].shards, local ? 2 : 0);
      EXPECT_EQ(e.clips()[m].rank, int64_t(m % 2));
    }
    // Rank 1's first step: every term carries its own symbol s1 only.
    for (const auto& st : e.steps()) {
      if (st.rank != 1 || st.step != 0) continue;
      for (const auto& [term, c] : st.grad)
        EXPECT_EQ(c.str().substr(c.str().size() - 3), "*s1") << c.str();
    }
  }
  // The shard symbol's value: chunk 1 of ceil(3/2) = 2 elements of
  // G = 1*g_0 with g_0 = (3, 4, 12): |(12)| = 12, so 0.5/(12 + 1e-6).
  contract::ClipRecord rec;
  rec.rank = 1;
  rec.max_norm = 0.5;
  rec.shards = 2;
  rec.before[Term{Term::grad, 0}].add({}, Rational(1));
  const std::vector<double> g0 = {3, 4, 12};
  const std::function<const std::vector<double>&(Term)> vec =
      [&](Term) -> const std::vector<double>& { return g0; };
  EXPECT_DOUBLE_EQ(contract::clip_values<double>({rec}, vec, 3)[0],
                   0.5 / (12 + 1e-6));
  rec.shards = 0;  // the whole gradient's norm: 13
  EXPECT_DOUBLE_EQ(contract::clip_values<double>({rec}, vec, 3)[0],
                   0.5 / (13 + 1e-6));
}

// zero-grad-never with clip-per-micro-step under DDP: every rank's clip
// multiplies its own buffer by its own symbol, and each all-reduce sums
// the ranks' products.  Expanded, a g_j's coefficient would hold R^W
// monomials after W windows (3^6 here; 12.6 GB in the property battery);
// kept as mean symbols, each coefficient is one monomial and each mean R
// of them.  The values are the expanded polynomials' (the property
// contract.coefficients checks them against the oracle).
TEST(Contract, AllReducedClipSymbolsStayMeans) {
  Scenario s = small(36, 1, 2);  // 12 micro-batches a rank: 6 windows
  s.clip.enabled = true;
  s.clip.max_norm = 0.5;
  s.batching.ranks = 3;
  CoefficientEngine e(
      [](const std::vector<int64_t>& ids) { return int64_t(ids.size()); });
  Trainer<CoefficientEngine> t(
      e, s,
      behavior_of({Pitfall::zero_grad_never, Pitfall::clip_per_micro_step}),
      s.optimizer.lr);
  t.run(make_plan(s), "x");
  ASSERT_EQ(e.steps().size(), 18u);  // 6 steps x 3 ranks
  size_t monomials = 0, degree = 0;
  for (const auto& st : e.steps())
    for (const auto& [term, c] : st.grad) {
      monomials = std::max(monomials, c.terms.size());
      for (const auto& [m, q] : c.terms) degree = std::max(degree, m.size());
    }
  // One monomial a coefficient, of at most the clips since the last
  // all-reduce (2) and one mean.
  EXPECT_EQ(monomials, 1u);
  EXPECT_LE(degree, 3u);
  size_t means = 0;
  for (const auto& sym : e.symbols())
    if (sym.clip < 0) {
      ++means;
      EXPECT_LE(sym.mean.terms.size(), 3u) << sym.mean.str();
    }
  EXPECT_GT(means, 0u);
}

TEST(Contract, ExactRationalOfADouble) {
  EXPECT_EQ(contract::exact_rational(0.375), Rational(3, 8));
  EXPECT_EQ(contract::exact_rational(-6.0), Rational(-6));
  EXPECT_EQ(contract::exact_rational(0.1) * 10 == 1, false);
}

// The property with a wrong weight must fail: the check has teeth.
RC_GTEST_PROP(Contract, BrokenOnPurposeFails, ()) {
  properties::Triggers t;
  t.max_width = 4;
  t.no_clip = true;
  const Scenario s = *properties::scenario(t).as("scenario");
  const properties::Case c(s);
  RC_ASSERT(properties::coefficient_check(c, {}, true) >
            properties::oracle_tolerance());
}

RC_GTEST_PROP(Contract, Coefficients, ()) {
  properties::run_property("contract.coefficients");
}

}  // namespace
}  // namespace accumcheck
