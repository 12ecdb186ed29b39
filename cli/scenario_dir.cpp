#include "cli/scenario_dir.hpp"

#include <filesystem>
#include <string>
#include <system_error>

namespace accumcheck::cli {

// An installed command (`pip install .`: ENV/bin/accumcheck) finds the
// scenarios installed beside it in ENV/share/accumcheck/scenarios; a
// command run from its build folder, the source tree's scenarios/.
const char* default_scenario_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      const fs::path installed = exe.parent_path().parent_path() / "share" /
                                 "accumcheck" / "scenarios";
      if (fs::is_directory(installed, ec)) return installed.string();
    }
    return std::string(ACCUMCHECK_SCENARIO_DIR);
  }();
  return dir.c_str();
}

std::string resolve_scenario(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (name.empty() || fs::exists(name, ec) ||
      name.find('/') != std::string::npos || fs::path(name).has_extension())
    return name;
  const fs::path named = fs::path(default_scenario_dir()) / (name + ".toml");
  return fs::is_regular_file(named, ec) ? named.string() : name;
}

std::string missing_scenario_hint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path given(path);
  if (path.empty() || fs::exists(given, ec) || given.extension() != ".toml")
    return "";
  const fs::path there = fs::path(default_scenario_dir()) / given.filename();
  if (!fs::is_regular_file(there, ec)) return "";
  const std::string name = given.stem().string();
  return path + " does not exist; accumcheck's scenario " + name + " is at " +
         there.string() + ": name it (" + name +
         ") instead of a path to use it from any folder";
}

}  // namespace accumcheck::cli
