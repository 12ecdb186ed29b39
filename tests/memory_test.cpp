// `accumcheck memory`: the lesson's invariants on the replay (the bytes
// themselves are checked against PyTorch in CTest Memory.PyTorch.*).
#include "verify/teach/memory.hpp"

#include <gtest/gtest.h>

#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"
#include "tests/source_dir.hpp"

namespace accumcheck {
namespace {

Scenario lesson() {
  return parse_scenario_file(::accumcheck::testing_util::source_dir() +
                             "/scenarios/memory-lesson.toml");
}

TEST(Memory, AccumulationKeepsGradientsAndStates) {
  const Scenario s = lesson();
  const MemoryRow big = memory_row(s, 64, 1), acc = memory_row(s, 8, 8);
  EXPECT_GT(acc.grads, 0);  // seed 002's 0 % is wrong
  EXPECT_EQ(acc.grads, big.grads);
  EXPECT_EQ(acc.params, big.params);
  EXPECT_EQ(acc.states, big.states);
  EXPECT_LT(acc.activations, big.activations);  // seed 000
}

TEST(Memory, ActivationsFollowBNotK) {
  const Scenario s = lesson();
  for (int64_t b : {1, 4, 32}) {
    const MemoryRow k1 = memory_row(s, b, 1), k8 = memory_row(s, b, 8);
    EXPECT_EQ(k1.activations, k8.activations) << b;
    EXPECT_EQ(k1.peak, k8.peak) << b;
  }
  // Linear in b above the b-independent loss scalars.
  const int64_t a1 = memory_row(s, 1, 1).activations,
                a2 = memory_row(s, 2, 1).activations,
                a4 = memory_row(s, 4, 1).activations;
  EXPECT_EQ(a4 - a2, 2 * (a2 - a1));
}

TEST(Memory, AdamStatesAreTwoPerParameter) {
  const Scenario s = lesson();
  const MemoryRow r = memory_row(s, 8, 8);
  // exp_avg + exp_avg_sq, plus a 4-byte step tensor per parameter tensor.
  EXPECT_EQ(r.states, 2 * r.params + 6 * 4);
  const MemoryRow mp = memory_row(s, 8, 8, true);
  EXPECT_EQ(mp.params + mp.grads + mp.master, 2 * r.params);  // 2 + 2 + 4
}

TEST(Memory, UnsupportedModelIsInputError) {
  Scenario s = lesson();
  s.model.norm = NormKind::layernorm;
  EXPECT_THROW(memory_row(s, 4, 1), InputError);
}

}  // namespace
}  // namespace accumcheck
