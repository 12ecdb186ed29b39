// Whole-file I/O with no half-written results (DESIGN.md section 9): a file
// is written under a temporary name in its own folder, flushed, and renamed
// over the target, so a reader sees the old file or the new one, never a
// torn one.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace accumcheck {

// Writes `bytes` to `path` atomically (temporary file + rename in the same
// folder).  The folder must exist.  Throws std::system_error on failure,
// leaving no temporary file behind.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Asks the kernel to back [p, p + bytes) with transparent huge pages
// (madvise MADV_HUGEPAGE on the 2 MiB-aligned part; nothing below 4 MiB
// or where the kernel says no).  Call before the memory is first touched:
// a 1M-parameter trace's gigabytes are then faulted in 2 MiB at a time
// instead of 4 KiB (certify's reading of it 35 s -> 23 s).
void advise_huge_pages(void* p, size_t bytes);

// The bytes of a file; throws InputError (file, no line) when it cannot be
// read, is not a regular file (a device such as /dev/zero, a pipe), or is
// larger than the limit `limit_key` of sim/limits.hpp (checked before a
// byte is read).
std::string read_file_bytes(const std::string& path,
                            std::string_view limit_key);

// The bytes of a file, read-only, with read_file_bytes' checks and errors:
// mapped (mmap MAP_POPULATE: the page cache's own pages, neither copied nor
// backed by fresh memory, which this VM faults in at about 1 GB/s), or
// read into memory where the kernel cannot map it.  For large inputs read
// once and kept (values.bin).  A trace is written once (atomically: a
// new file renamed over the old one leaves a held mapping intact) and read
// after; a file cut short in place while it is held (`cp` over it,
// `truncate`) makes its reader fault (SIGBUS), which a handler installed
// with the first mapping turns into the input error's message naming the
// file and exit code 2, as it cannot be thrown from there.
class FileBytes {
 public:
  FileBytes() = default;
  FileBytes(const std::string& path, std::string_view limit_key);
  ~FileBytes();
  FileBytes(FileBytes&& o) noexcept;
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;

  std::string_view view() const {
    return map_ ? std::string_view(map_, size_) : std::string_view(read_);
  }
  const char* data() const { return view().data(); }
  size_t size() const { return view().size(); }

 private:
  void release();
  const char* map_ = nullptr;  // the mapping, or nullptr (read_)
  size_t size_ = 0;
  std::string read_;
};

// Checks, before any work, that `dir` can be a folder we write into: it
// is a folder or does not exist yet, no part of its path is a file, and
// the nearest existing folder on its path is writable.  Throws InputError
// naming `option` (e.g. "--out") otherwise.
void require_output_folder(const std::string& dir, const std::string& option);

// The same for a file we are about to write: not a folder, and its folder
// can be created (require_output_folder).
void require_output_file(const std::string& path, const std::string& option);

// write_file_atomically() into `path`, creating its folder, with every
// failure (permissions, a file where a folder belongs, a full disk) an
// InputError naming `option`: the user's path, never an internal error.
void write_output_file(const std::string& path, std::string_view bytes,
                       const std::string& option);

}  // namespace accumcheck
