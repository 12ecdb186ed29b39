#include "tests/source_dir.hpp"

namespace accumcheck::testing_util {

std::string source_dir() { return ACCUMCHECK_SOURCE_DIR; }

}  // namespace accumcheck::testing_util
