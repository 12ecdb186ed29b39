// A device property on the CUDA executor as a GoogleTest test: skipped,
// with the reason, where no GPU is present; otherwise run by RapidCheck
// like the RC_GTEST_PROP tests.
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>

#include "gpu/cuda/cuda_executor.hpp"
#include "properties/harness.hpp"

#define ACCUMCHECK_CUDA_PROP(Suite, Name, property)                \
  TEST(Suite, Name) {                                              \
    std::string why;                                               \
    if (!::accumcheck::cuda_available(&why)) GTEST_SKIP() << why;  \
    ::rc::detail::checkGTest(                                      \
        [] { ::accumcheck::properties::run_property(property); }); \
  }
