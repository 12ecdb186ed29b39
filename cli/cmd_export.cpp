// `accumcheck export`: the bundle an outside trainer trains on.
#include <cstdio>

#include "cli/commands.hpp"
#include "sim/atomic_file.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/export/export.hpp"

namespace accumcheck::cli {

int export_command(const ExportOptions& o) {
  const Scenario s = parse_scenario_file(o.scenario);
  require_output_folder(o.out, "--out");
  const ExportResult r = export_bundle(s, o.out);
  for (const std::string& w : r.warnings)
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (!o.quiet) {
    std::printf("exported %s (digest %s, %lld optimizer steps under %s) to %s:",
                s.name.c_str(), r.digest.c_str(), (long long)r.steps,
                semantics_name(s.trainer.accepted).c_str(), o.out.c_str());
    for (const std::string& f : r.files) std::printf(" %s", f.c_str());
    std::printf("\n");
  }
  return 0;
}

}  // namespace accumcheck::cli
