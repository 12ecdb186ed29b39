// The precision, loss-scaling and training-state properties of
// properties/precision_properties.cpp as RC_GTEST_PROP tests (the CUDA
// variant is in tests/precision_test.cpp).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/harness.hpp"

namespace accumcheck::properties {

RC_GTEST_PROP(Precision, LowPrecisionGradBuffer, ()) {
  run_property("precision.low-precision-grad-buffer");
}
RC_GTEST_PROP(Precision, BufferBoundDevice, ()) {
  run_property("precision.buffer-bound.device");
}
RC_GTEST_PROP(Scaler, ExactPowersOfTwo, ()) {
  run_property("scaler.exact-powers-of-two");
}
RC_GTEST_PROP(Scaler, SkipLeavesState, ()) {
  run_property("scaler.skip-leaves-state");
}
RC_GTEST_PROP(Scaler, SkippedStepAdvancesScheduler, ()) {
  run_property("scaler.skipped-step-advances-scheduler");
}
RC_GTEST_PROP(Scaler, ClipBeforeUnscale, ()) {
  run_property("scaler.clip-before-unscale");
}
RC_GTEST_PROP(Scaler, UpdateEveryMicroStep, ()) {
  run_property("scaler.update-every-micro-step");
}
RC_GTEST_PROP(State, AccumulatorRescaled, ()) {
  run_property("state.accumulator-rescaled");
}
RC_GTEST_PROP(State, EmaPerStep, ()) { run_property("state.ema-per-step"); }
RC_GTEST_PROP(State, EmaEveryMicroStep, ()) {
  run_property("state.ema-every-micro-step");
}
RC_GTEST_PROP(State, OptimizerStateEveryMicroStep, ()) {
  run_property("state.optimizer-state-every-micro-step");
}

}  // namespace accumcheck::properties
