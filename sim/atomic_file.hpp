// Whole-file I/O with no half-written results (DESIGN.md section 9): a file
// is written under a temporary name in its own folder, flushed, and renamed
// over the target, so a reader sees the old file or the new one, never a
// torn one.
#pragma once

#include <string>
#include <string_view>

namespace accumcheck {

// Writes `bytes` to `path` atomically (temporary file + rename in the same
// folder).  The folder must exist.  Throws std::system_error on failure,
// leaving no temporary file behind.
void write_file_atomically(const std::string& path, std::string_view bytes);

// The bytes of a file; throws InputError (file, no line) when it cannot be
// read.
std::string read_file_bytes(const std::string& path);

}  // namespace accumcheck
