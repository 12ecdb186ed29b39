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

// For a scenario path that does not exist whose file name is one of the
// default folder's scenarios (the README's `scenarios/X.toml` typed outside
// a clone, with the command installed by pip): a line that says how to name
// it; empty otherwise.
std::string missing_scenario_hint(const std::string& path);

}  // namespace accumcheck::cli
