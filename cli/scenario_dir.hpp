// The scenarios/ folder of the source tree this binary was built from
// (`accumcheck list`'s and `report`'s default), compiled on its own in
// cli/scenario_dir.cpp so that no other object depends on the clone's
// folder (cmake/unity.cmake).
#pragma once

namespace accumcheck::cli {

const char* default_scenario_dir();

}  // namespace accumcheck::cli
