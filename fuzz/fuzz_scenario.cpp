// libFuzzer target: the scenario parser (sim/scenario_parse.hpp).
//
// Any bytes are a scenario file.  A bad one must be an InputError (exit 2
// in the CLI); any other exception escapes and libFuzzer reports it as a
// crash, like every sanitizer report.  A scenario that parses must
// survive to_toml and parse back to the same settings (the round trip the
// counterexample printer relies on).  A relative `csv` path resolves
// against a folder that does not exist.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accumcheck;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string path = "/nonexistent-accumcheck-fuzz/fuzz.toml";
  Scenario s;
  try {
    s = parse_scenario_string(text, path);
  } catch (const InputError&) {
    return 0;
  }
  std::string again;
  try {
    again = to_toml(s);
  } catch (const std::invalid_argument&) {
    return 0;  // documented: a seed >= 2^63 has no TOML spelling
  }
  if (s.data.source == DataSource::csv) return 0;  // the file is not there
  const Scenario t = parse_scenario_string(again, path);
  if (to_toml(t) != again) std::abort();  // the round trip must be exact
  return 0;
}
