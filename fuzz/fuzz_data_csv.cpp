// libFuzzer target: the CSV data reader (sim/data.hpp, make_dataset on a
// scenario with [data] csv).
//
// The first byte picks the model the file must fit (even: mse, x0,x1,y0;
// odd: cross-entropy with 3 classes, x0,x1,x2,label); the rest is the
// file.  Seeds: tests/data/tiny_mse.csv and tiny_ce.csv.
// A bad file must be an InputError; anything else is a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_files.hpp"
#include "sim/data.hpp"
#include "sim/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accumcheck;
  static const fuzz::ScratchDir dir;
  if (size == 0) return 0;
  const bool ce = (data[0] & 1) != 0;
  Scenario s;
  s.model.widths = {ce ? 3 : 2, 4, ce ? 3 : 1};
  s.model.loss = ce ? LossKind::cross_entropy : LossKind::mse;
  s.data.source = DataSource::csv;
  s.data.samples = 0;  // any row count
  s.data.csv_path = dir.write(
      "data.csv",
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  try {
    const Dataset d = make_dataset(s);
    if (d.n < 1) __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
