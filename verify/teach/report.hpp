// `accumcheck report`: a trace (and, for a certify report, certify's
// results) turned into one self-contained HTML file with plots (uPlot,
// inlined; see verify/CMakeLists.txt), for teaching.
//
// Traces are read only through verify/trace/trace.hpp.  Windows are the large-
// batch reference's optimizer steps: the reference takes one micro-batch
// holding the whole window per step, so window w ends when a run has
// consumed as many samples as the reference through its step w.  Every
// run is cut at those sample counts: its window loss is the item-weighted
// mean of its micro-batch losses inside the window, its parameters at the
// window end are those after its last optimizer step before the cut.  A
// run that has not stepped yet (or a trace without the reference) has no
// distance there: the plot shows a gap.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/scenario.hpp"
#include "verify/certify/certify.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

struct ReportRun {
  std::string name;
  std::vector<double> window_loss;     // per reference window (NaN: none)
  std::vector<double> window_dist;     // |theta - theta_ref| / |theta_ref|
  std::vector<double> step_lr;         // per optimizer step
  std::vector<double> step_grad_norm;  // of the gradient handed to the step
};

// A contract-tier trace (meta.csv tier,contract): no scenario, no
// reference; what its recorder measured, per optimizer step of rank 0.
struct ReportContractStep {
  double lr = kNaN;
  // The micro-batches the step holds (measured weight above 1e-3 of the
  // step's largest: the step fit's beta*G_prev leaves the previous step's
  // near 0), each weight x N, N the items of those micro-batches (all
  // ranks'): 1 each under correct accumulation.
  std::vector<int64_t> micro;
  std::vector<double> weight_n;
  int64_t items = 0;
  std::vector<double> clip;  // the factors of its clip_grad_norm_ calls
};
struct ReportContract {
  int64_t accumulation = 0, ranks = 1, micro_batches = 0;
  std::vector<ReportContractStep> steps;
};

struct ReportData {
  std::string scenario, story, settings, engine, precision;
  std::vector<std::string> pitfalls;  // the explain ids shown on top
  int64_t windows = 0;
  std::vector<ReportRun> runs;  // trace order
  std::optional<CertifyReport> certify;
  std::optional<ReportContract> contract;
};

// The runs of a trace as per-window and per-step series.  `s` (the
// trace's scenario, its digest checked by the caller) gives the story,
// the settings and the layout; InputError on a malformed trace.
ReportData report_data(const Trace& t, const Scenario& s);

// A contract-tier trace's page data (`c` read from the same folder);
// InputError when `t` is not one.  Its verdict is the caller's
// (certify_contract) to add.
ReportData contract_report_data(const Trace& t, const ContractSection& c);

// The HTML page (deterministic bytes for the same data).
std::string report_html(const ReportData& d);

// Reads the scenario a trace names: `scenario_file` when given, else
// `<scenario_dir>/<meta scenario>.toml`; InputError when it is missing or
// its digest is not the trace's.
Scenario scenario_of_trace(const Trace& t, const std::string& scenario_file,
                           const std::string& scenario_dir);

}  // namespace accumcheck
