// `accumcheck export`: the bundle an outside trainer needs to train on a
// scenario exactly as accumcheck does (DESIGN.md section 7).
//
// A bundle is a folder of tidy CSV files (one header each; floats %.17g,
// which read back exactly in float32 and float64) plus the scenario file
// and a README.txt:
//   data.csv             sample, x0..x{d_in-1}, then y0..y{d_out-1} (mse)
//                        or label (cross-entropy)
//   tensors.csv          tensor, dims, rows, cols, offset  (PyTorch names:
//                        nn.Sequential Linear l is "{2l}.weight" [out x in],
//                        "{2l}.bias" [out])
//   params.csv           tensor, index, row, col, value: initial parameters
//   batches.csv          epoch, window, micro, rank, position, sample,
//                        window_micro_batches, window_items, partial
//   hyperparameters.csv  key, value: model, optimizer, schedule, clip,
//                        batching, accepted semantics, digest, schema
//   lr_schedule.csv      step, epoch, window, lr: the lr of each optimizer
//                        step under the accepted semantics
//   scenario.toml        the scenario file's bytes (digest in
//                        hyperparameters.csv); with a [data] csv file,
//                        its csv value names the copy below instead
//   scenario-data.csv    that csv file's bytes (csv scenarios only)
// The folder is written under a temporary name and renamed into place, so
// it is complete or absent.
#pragma once

#include <string>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

// Why this scenario cannot tell some pitfalls apart (empty: it can tell
// every one of them from `correct`).
std::vector<std::string> export_warnings(const Scenario& s);

struct ExportResult {
  std::vector<std::string> files;  // written, relative to the bundle
  std::vector<std::string> warnings;
  int64_t steps = 0;   // optimizer steps under the accepted semantics
  std::string digest;  // of the bundle's scenario.toml
};

// Writes the bundle for `s` (parsed from s.path, whose bytes are copied)
// into `out`.  `out` may be missing, empty, or a previous bundle (which is
// replaced); anything else is an InputError.
// Export and certify cover every model but dropout (accumcheck keys masks
// by sample; PyTorch draws them in call order, so an outside trainer could
// not reproduce them): refused with an InputError naming model.dropout;
// and every ranks != 1 (data parallelism: its own issue), naming
// batching.ranks.
void require_exportable_model(const Scenario& s);

ExportResult export_bundle(const Scenario& s, const std::string& out);

}  // namespace accumcheck
