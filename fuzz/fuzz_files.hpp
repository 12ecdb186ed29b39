// Scratch files for the fuzz targets whose readers take paths (the trace
// reader reads a folder, the CSV data reader a file): one private folder
// per process, under /dev/shm when it exists (no disk traffic), removed at
// exit.  Each input is written with plain stdio, so the reader under test
// sees exactly the fuzzer's bytes.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace accumcheck::fuzz {

class ScratchDir {
 public:
  ScratchDir() {
    std::string base =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string tmpl = base + "/accumcheck-fuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `bytes` to path()/name and returns the file's path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string p = path_ + "/" + name;
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (!f) std::abort();
    if (!bytes.empty() &&
        std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
      std::abort();
    if (std::fclose(f) != 0) std::abort();
    return p;
  }

 private:
  std::string path_;
};

}  // namespace accumcheck::fuzz
