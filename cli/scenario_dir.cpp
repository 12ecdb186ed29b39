#include "cli/scenario_dir.hpp"

namespace accumcheck::cli {

const char* default_scenario_dir() { return ACCUMCHECK_SCENARIO_DIR; }

}  // namespace accumcheck::cli
