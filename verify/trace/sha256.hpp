// SHA-256 (FIPS 180-4), for the trace's completion record (complete.csv,
// verify/trace/complete.cpp): the digest of every file a writer wrote,
// so a file cut, emptied or replaced after the run is told from the one
// the run wrote.  Python's hashlib.sha256 writes the same digests
// (python/accumcheck_trace/trace.py).  Portable C++, no library: the
// reader must not depend on what the machine's OpenSSL is.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace accumcheck {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  // The digest as 64 lowercase hex digits; the object is spent after.
  std::string hex();

 private:
  void block(const unsigned char* p);
  std::array<uint32_t, 8> h_;
  std::array<unsigned char, 64> buf_{};
  size_t used_ = 0;      // bytes in buf_
  uint64_t length_ = 0;  // bytes hashed
};

// The digest of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

}  // namespace accumcheck
