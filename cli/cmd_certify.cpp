// `accumcheck certify`: an outside trainer's trace judged against a
// scenario (verify/certify.hpp).
#include <cstdio>

#include "cli/commands.hpp"
#include "sim/atomic_file.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/certify.hpp"

namespace accumcheck::cli {

int certify_command(const CertifyOptions& o) {
  const Scenario s = parse_scenario_file(o.scenario);
  // A --junit path we could not write is refused before any judging.
  if (!o.junit.empty()) require_output_file(o.junit, "--junit");
  CertifyConfig cfg;
  cfg.run = o.run;
  cfg.fp64 = o.precision == "fp64";
  const CertifyReport r = certify(s, o.trace, cfg);
  if (o.quiet)
    std::printf("%s\n", r.verdict.c_str());
  else
    std::printf("%s", certify_text(r, o.top).c_str());
  if (!o.junit.empty()) write_output_file(o.junit, certify_junit(r), "--junit");
  std::fflush(stdout);
  if (!o.quiet) std::fprintf(stderr, "certify: %.2f s\n", r.seconds);
  return r.pass ? 0 : 1;
}

}  // namespace accumcheck::cli
