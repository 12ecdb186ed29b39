// Scenario files (TOML, DESIGN.md section 7): parse and validate into a
// Scenario, and write a Scenario back as a file that parses to an equal
// one (how shrunk counterexamples are printed).
//
// Every problem is an InputError naming the file, line and column (from
// toml++'s source regions; a missing key points at its section, or line 0
// when the section is absent too), the dotted key and what was expected.
// Unknown sections and keys are errors, with a "did you mean" suggestion.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sim/scenario.hpp"

namespace accumcheck {

// FNV-1a 64 of `bytes`.
inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The scenario digest: FNV-1a 64 of the file's bytes, 16 lowercase hex
// digits.  Traces carry it; readers recompute it from the scenario file.
inline std::string digest_hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t h = fnv1a64(bytes);
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[size_t(i)] = kHex[h & 15];
  return s;
}

// Reads and validates a scenario file.  A CSV data file it names is read
// too (header, column count, values; data.samples is set to its row
// count).  Throws InputError.
Scenario parse_scenario_file(const std::string& path);

// The same from text already in memory; `path_for_errors` names the file
// in errors, gives Scenario::name (its stem) and path, and is the folder a
// relative CSV path is resolved against.
Scenario parse_scenario_string(std::string_view text,
                               const std::string& path_for_errors);

// A complete scenario file for `s`: every setting spelled out, doubles in
// shortest round-trip form, so parse_scenario_string(to_toml(s)) equals s
// (name, path and digest aside, which come from the file; settings that
// do not apply, such as momentum under Adam, are left out).  Throws
// std::invalid_argument for a seed >= 2^63, which TOML cannot spell.
std::string to_toml(const Scenario& s);

}  // namespace accumcheck
