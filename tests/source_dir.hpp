// The source tree of this build (scenarios/, tests/data/): the one place a
// test learns it, compiled on its own in tests/source_dir.cpp so that no
// other test object depends on the folder of the clone (cmake/unity.cmake).
#pragma once

#include <string>

namespace accumcheck::testing_util {

std::string source_dir();

}  // namespace accumcheck::testing_util
