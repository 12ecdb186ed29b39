// The BatchNorm / LayerNorm / token-loss / dropout properties of
// properties/norm_properties.cpp as RC_GTEST_PROP tests (RapidCheck's
// default 100 cases each; RC_PARAMS overrides).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/harness.hpp"
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "tests/cuda_property.hpp"
#endif

namespace accumcheck::properties {
RC_GTEST_PROP(Token, CorrectEqualsLargeBatch, ()) {
  run_property("token.correct-equals-large-batch");
}
RC_GTEST_PROP(Token, MeanOfMeansWeights, ()) {
  run_property("token.mean-of-means-weights");
}
RC_GTEST_PROP(Token, UnshiftedLabelCountWeights, ()) {
  run_property("token.unshifted-label-count-weights");
}
RC_GTEST_PROP(Token, MeanOfMeansEqualLengthsIsCorrect, ()) {
  run_property("token.mean-of-means-equal-lengths-is-correct");
}
RC_GTEST_PROP(BatchNorm, ReplicatedZeroDivergence, ()) {
  run_property("batchnorm.replicated-zero-divergence");
}
RC_GTEST_PROP(BatchNorm, MicroStatsDivergence, ()) {
  run_property("batchnorm.micro-stats-divergence");
}
RC_GTEST_PROP(BatchNorm, RunningStatsKUpdates, ()) {
  run_property("batchnorm.running-stats-k-updates");
}
RC_GTEST_PROP(LayerNorm, CorrectEqualsLargeBatch, ()) {
  run_property("layernorm.correct-equals-large-batch");
}
RC_GTEST_PROP(GroupNorm, CorrectEqualsLargeBatch, ()) {
  run_property("groupnorm.correct-equals-large-batch");
}
RC_GTEST_PROP(Dropout, SampleKeyedEqualsLargeBatch, ()) {
  run_property("dropout.sample-keyed-equals-large-batch");
}
RC_GTEST_PROP(DeviceNorm, Token, ()) { run_property("device.token"); }
RC_GTEST_PROP(DeviceNorm, BatchNorm, ()) { run_property("device.batchnorm"); }
RC_GTEST_PROP(DeviceNorm, LayerNormDropout, ()) {
  run_property("device.layernorm-dropout");
}
RC_GTEST_PROP(DeviceNorm, GroupNorm, ()) { run_property("device.groupnorm"); }

// The same on the CUDA executor: skipped, with the reason, without a GPU.
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
ACCUMCHECK_CUDA_PROP(DeviceNormCuda, Token, "cuda.token")
ACCUMCHECK_CUDA_PROP(DeviceNormCuda, BatchNorm, "cuda.batchnorm")
ACCUMCHECK_CUDA_PROP(DeviceNormCuda, LayerNormDropout, "cuda.layernorm-dropout")
ACCUMCHECK_CUDA_PROP(DeviceNormCuda, GroupNorm, "cuda.groupnorm")
#endif

}  // namespace accumcheck::properties
