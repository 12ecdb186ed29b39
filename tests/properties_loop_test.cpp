// The window-cutting, drawing and scheduler-order properties of
// properties/loop_properties.cpp and the framework loops' of
// properties/framework_loop_properties.cpp as RC_GTEST_PROP tests.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/harness.hpp"

namespace accumcheck::properties {
RC_GTEST_PROP(Loop, WindowOffByOne, ()) { run_property("window.off-by-one"); }
RC_GTEST_PROP(Loop, WindowOffByOneMaxSteps, ()) {
  run_property("window.off-by-one-max-steps");
}
RC_GTEST_PROP(Loop, WindowCounterAcrossEpochs, ()) {
  run_property("window.counter-across-epochs");
}
RC_GTEST_PROP(Loop, StepBudget, ()) { run_property("window.step-budget"); }
RC_GTEST_PROP(Loop, ItemsPerFetchGroup, ()) {
  run_property("window.items-per-fetch-group");
}
RC_GTEST_PROP(Loop, LastFetchInSamples, ()) {
  run_property("window.last-fetch-in-samples");
}
RC_GTEST_PROP(Loop, SkipShortMicroBatch, ()) {
  run_property("data.skip-short-micro-batch");
}
RC_GTEST_PROP(Loop, SchedulerOrder, ()) { run_property("scheduler.order"); }
RC_GTEST_PROP(Loop, LossDividedByKTwice, ()) {
  run_property("framework.loss-divided-by-k-twice");
}
RC_GTEST_PROP(Loop, EndOfLoaderSyncsEveryMicroBatch, ()) {
  run_property("framework.end-of-loader");
}
RC_GTEST_PROP(Loop, WindowBufferAcrossEpochs, ()) {
  run_property("window.buffer-across-epochs");
}
RC_GTEST_PROP(Loop, WindowSumAcrossEpochs, ()) {
  run_property("window.sum-across-epochs");
}
}  // namespace accumcheck::properties
