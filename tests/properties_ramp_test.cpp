// The K-per-epoch properties of properties/properties.cpp (section (j)) as
// RC_GTEST_PROP tests (RC_PARAMS sets cases and seed; CTest pins both).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/harness.hpp"

namespace accumcheck::properties {

RC_GTEST_PROP(Ramp, CorrectEqualsLargeBatch, ()) {
  run_property("ramp.correct-equals-large-batch");
}
RC_GTEST_PROP(Ramp, NormalizationStale, ()) {
  run_property("ramp.normalization-stale");
}
RC_GTEST_PROP(Ramp, ScheduleHorizonFixed, ()) {
  run_property("ramp.schedule-horizon-fixed");
}

}  // namespace accumcheck::properties
