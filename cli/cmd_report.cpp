// `accumcheck report`: a trace as one self-contained HTML page
// (verify/teach/report.hpp).
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/scenario_dir.hpp"
#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"
#include "verify/contract/contract.hpp"
#include "verify/teach/report.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::cli {

std::string write_html_report(const std::string& trace_dir,
                              const std::string& scenario_file,
                              const std::string& out) {
  const std::string file = out.empty() ? trace_dir + "/report.html" : out;
  require_output_file(file, "--out");
  const Trace t = read_trace(trace_dir);
  if (t.meta_value("tier") == "contract") {
    // A contract-tier trace has no scenario: what its recorder measured,
    // and the contract tier's verdict on it (as certify --contract --html).
    if (!scenario_file.empty())
      throw InputError("", 0, 0, "--scenario",
                       "a contract-tier trace has no scenario (meta.csv "
                       "tier,contract): drop --scenario");
    ReportData d = contract_report_data(t, read_contract(trace_dir));
    d.certify = certify_contract(trace_dir);
    write_output_file(file, report_html(d), "--out");
    return file;
  }
  const Scenario s = scenario_of_trace(
      t, scenario_file, ::accumcheck::cli::default_scenario_dir());
  write_output_file(file, report_html(report_data(t, s)), "--out");
  return file;
}

int report_command(const ReportOptions& o) {
  const std::string file = write_html_report(o.trace, o.scenario, o.out);
  std::printf("report: %s\n", file.c_str());
  return 0;
}

}  // namespace accumcheck::cli
