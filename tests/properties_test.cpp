// The property battery as GoogleTest tests: one RC_GTEST_PROP per property
// of properties/ (RC_PARAMS sets cases and seed; CTest pins both), and a
// closing table of cases and worst error/tolerance per property.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "properties/harness.hpp"
#include "tests/source_dir.hpp"
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "tests/cuda_property.hpp"
#endif

namespace accumcheck::properties {
namespace {

class StatsPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    const auto stats = property_stats();
    if (stats.empty()) return;
    std::printf("\n%-44s %6s %12s %14s\n", "property", "cases", "worst err/tol",
                "min gap/tol");
    for (const auto& [name, s] : stats) {
      char gap[32] = "-";
      if (s.min_gap_ratio >= 0)
        std::snprintf(gap, sizeof gap, "%.3g", s.min_gap_ratio);
      std::printf("%-44s %6lld %12.3g %14s\n", name.c_str(), (long long)s.cases,
                  s.worst_ratio, gap);
    }
  }
};
const auto* const kStats =
    ::testing::AddGlobalTestEnvironment(new StatsPrinter);

}  // namespace

// Every property of the battery runs under CTest: its name, quoted, is in
// a test source (a property registered without its RC_GTEST_PROP runs only
// in `accumcheck check`, never in CI).
TEST(Properties, EveryPropertyHasItsCTestCase) {
  std::string sources;
  namespace fs = std::filesystem;
  for (const auto& e :
       fs::directory_iterator(testing_util::source_dir() + "/tests")) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    sources += ss.str();
  }
  ASSERT_FALSE(sources.empty());
  for (const Property& p : all_properties())
    EXPECT_NE(sources.find('"' + p.name + '"'), std::string::npos)
        << p.name << " has no run_property(\"" << p.name
        << "\") in tests/ (add an RC_GTEST_PROP)";
}

RC_GTEST_PROP(Equivalence, Oracle, ()) { run_property("equivalence.oracle"); }
RC_GTEST_PROP(LossNormalization, NoLossNormalizationWeights, ()) {
  run_property("loss-normalization.no-loss-normalization");
}
RC_GTEST_PROP(LossNormalization, SgdAtKTimesLr, ()) {
  run_property("loss-normalization.sgd-at-k-lr");
}
RC_GTEST_PROP(LossNormalization, AdamEpsOverK, ()) {
  run_property("loss-normalization.adam-eps-over-k");
}
RC_GTEST_PROP(LossNormalization, SampleMeanOfMeans, ()) {
  run_property("loss-normalization.sample-mean-of-means");
}
RC_GTEST_PROP(LossNormalization, SummedLossDividedByK, ()) {
  run_property("loss-normalization.summed-loss-divided-by-k");
}
RC_GTEST_PROP(ZeroGrad, EveryMicroStep, ()) {
  run_property("zero-grad.every-micro-step");
}
RC_GTEST_PROP(ZeroGrad, Seed002Loop, ()) {
  run_property("zero-grad.seed-002-loop");
}
RC_GTEST_PROP(ZeroGrad, Never, ()) { run_property("zero-grad.never"); }
RC_GTEST_PROP(ZeroGrad, StepEveryMicroStep, ()) {
  run_property("zero-grad.step-every-micro-step");
}
RC_GTEST_PROP(Partial, CorrectWeighsOneOverN, ()) {
  run_property("partial.correct-weighs-1-over-n");
}
RC_GTEST_PROP(Partial, ScaleByK, ()) { run_property("partial.scale-by-k"); }
RC_GTEST_PROP(Partial, Drop, ()) { run_property("partial.drop"); }
RC_GTEST_PROP(Partial, Leak, ()) { run_property("partial.leak"); }
RC_GTEST_PROP(Scheduler, Drift, ()) { run_property("scheduler.drift"); }
RC_GTEST_PROP(Clip, PerMicroStep, ()) { run_property("clip.per-micro-step"); }
RC_GTEST_PROP(Decay, L2InLossUnnormalized, ()) {
  run_property("decay.l2-in-loss-unnormalized");
}
RC_GTEST_PROP(Decay, AdamWOncePerStep, ()) {
  run_property("decay.adamw-once-per-step");
}
RC_GTEST_PROP(Inertness, Oracle, ()) { run_property("inertness.oracle"); }
RC_GTEST_PROP(Ddp, GradientOutsideTrainer, ()) {
  run_property("ddp.gradient-outside-trainer");
}
RC_GTEST_PROP(Ddp, RepartitionOracle, ()) {
  run_property("ddp.repartition.oracle");
}
RC_GTEST_PROP(Ddp, RepartitionDevice, ()) {
  run_property("ddp.repartition.device");
}
RC_GTEST_PROP(Ddp, UnevenShards, ()) { run_property("ddp.uneven-shards"); }
RC_GTEST_PROP(Ddp, NoSyncEverywhere, ()) {
  run_property("ddp.no-sync-everywhere");
}
RC_GTEST_PROP(Ddp, SyncEveryMicroStep, ()) {
  run_property("ddp.sync-every-micro-step");
}
RC_GTEST_PROP(Ddp, ClipLocalNorm, ()) { run_property("ddp.clip-local-norm"); }
RC_GTEST_PROP(Ddp, SchedulerPerRank, ()) {
  run_property("ddp.scheduler-per-rank");
}
RC_GTEST_PROP(Inertness, Ddp, ()) { run_property("inertness.ddp"); }
RC_GTEST_PROP(Equivalence, Device, ()) { run_property("equivalence.device"); }
RC_GTEST_PROP(Trajectory, DeviceSmooth, ()) {
  run_property("trajectory.device-smooth");
}
RC_GTEST_PROP(Backward, TwiceIsTwoTimes, ()) {
  run_property("backward.twice-is-2x.device");
}
RC_GTEST_PROP(Bitwise, AccumulationEqualsLargeBatch, ()) {
  run_property("bitwise.accumulation-equals-large-batch.device");
}
RC_GTEST_PROP(Determinism, Traces, ()) {
  run_property("determinism.traces.device");
}
RC_GTEST_PROP(Difference, Device, ()) { run_property("difference.device"); }

// The same device properties on the CUDA executor: skipped, with the
// reason, where no GPU is present.
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
ACCUMCHECK_CUDA_PROP(EquivalenceCuda, Device, "equivalence.cuda")
ACCUMCHECK_CUDA_PROP(TrajectoryCuda, DeviceSmooth, "trajectory.cuda-smooth")
ACCUMCHECK_CUDA_PROP(BackwardCuda, TwiceIsTwoTimes, "backward.twice-is-2x.cuda")
ACCUMCHECK_CUDA_PROP(BitwiseCuda, AccumulationEqualsLargeBatch,
                     "bitwise.accumulation-equals-large-batch.cuda")
ACCUMCHECK_CUDA_PROP(DeterminismCuda, Traces, "determinism.traces.cuda")
ACCUMCHECK_CUDA_PROP(DifferenceCuda, Device, "difference.cuda")
#endif

}  // namespace accumcheck::properties
