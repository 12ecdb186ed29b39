// `accumcheck list`: every scenario with its one-line story.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "cli/commands.hpp"
#include "cli/scenario_dir.hpp"
#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"

namespace accumcheck::cli {

int list_command(const ListOptions& o) {
  namespace fs = std::filesystem;
  const fs::path dir = o.dir.empty()
                           ? fs::path(::accumcheck::cli::default_scenario_dir())
                           : fs::path(o.dir);
  if (!fs::is_directory(dir))
    throw InputError(dir.string(), 0, 0, "--dir", "not a directory");
  std::vector<fs::path> files;
  try {
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".toml") files.push_back(entry.path());
  } catch (const fs::filesystem_error& e) {  // e.g. no read permission
    throw InputError(dir.string(), 0, 0, "--dir", e.code().message());
  }
  std::sort(files.begin(), files.end());
  size_t width = 0;
  for (const auto& f : files) width = std::max(width, f.stem().string().size());
  int code = 0;
  for (const auto& f : files) {
    try {
      const Scenario s = parse_scenario_file(f.string());
      std::printf("%-*s  %s\n", int(width), s.name.c_str(), s.story.c_str());
    } catch (const InputError& e) {
      std::fprintf(stderr, "accumcheck: %s\n", e.what());
      code = 2;
    }
  }
  return code;
}

}  // namespace accumcheck::cli
