// `accumcheck certify`: an outside trainer's trace judged against a
// scenario (verify/certify.hpp).
#include <cstdio>

#include "cli/commands.hpp"
#include "sim/atomic_file.hpp"
#include "verify/certify.hpp"
#include "verify/report.hpp"
#include "verify/trace.hpp"
#include "sim/scenario_parse.hpp"

namespace accumcheck::cli {

int certify_command(const CertifyOptions& o) {
  const Scenario s = parse_scenario_file(o.scenario);
  CertifyConfig cfg;
  cfg.run = o.run;
  cfg.fp64 = o.precision == "fp64";
  const CertifyReport r = certify(s, o.trace, cfg);
  if (o.quiet)
    std::printf("%s\n", r.verdict.c_str());
  else
    std::printf("%s", certify_text(r, o.top).c_str());
  if (!o.junit.empty()) write_file_atomically(o.junit, certify_junit(r));
  if (!o.html.empty()) {
    // The trace read again through the one reader, for its curves.
    ReportData d = report_data(read_trace(o.trace), s);
    d.certify = r;
    write_file_atomically(o.html, report_html(d));
  }
  std::fflush(stdout);
  if (!o.quiet) std::fprintf(stderr, "certify: %.2f s\n", r.seconds);
  return r.pass ? 0 : 1;
}

}  // namespace accumcheck::cli
