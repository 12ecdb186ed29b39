// The scenarios/ folder: an installed command's share/accumcheck/scenarios,
// else the source tree's this binary was built from (`accumcheck list`'s
// and `report`'s default), compiled on its own in
// cli/scenario_dir.cpp so that no other object depends on the clone's
// folder (cmake/unity.cmake).
#pragma once

#include <string>

namespace accumcheck::cli {

const char* default_scenario_dir();

// `name` when it names a file; else, for a bare name (no '/', no
// extension) of a scenario in default_scenario_dir(), that file's path;
// else `name` unchanged (the command's own error names it).
std::string resolve_scenario(const std::string& name);

}  // namespace accumcheck::cli
