// `accumcheck certify`: an outside trainer's trace judged against a
// scenario (verify/certify/certify.hpp); `accumcheck certify-merge`: the parts
// of a certification run on several machines, merged
// (verify/certify/parts.hpp).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string_view>

#include "cli/commands.hpp"
#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/certify/certify.hpp"
#include "verify/certify/parts.hpp"
#include "verify/contract/contract.hpp"
#include "verify/teach/report.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::cli {

namespace {

int report(const CertifyReport& r, bool quiet, int top,
           const std::string& junit) {
  if (quiet)
    std::printf("%s\n", r.verdict.c_str());
  else
    std::printf("%s", certify_text(r, top).c_str());
  if (!junit.empty()) write_output_file(junit, certify_junit(r), "--junit");
  std::fflush(stdout);
  if (!quiet) std::fprintf(stderr, "certify: %.2f s\n", r.seconds);
  return r.pass ? 0 : 1;
}

// certify's progress on a terminal (stderr): one line, rewritten at most
// five times a second by whichever judging thread gets there, and erased
// before the report is printed (or when an error ends certify).
class ProgressLine {
 public:
  void update(std::string_view stage, int64_t done, int64_t total) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock) return;  // another thread is printing: skip this step
    const auto now = std::chrono::steady_clock::now();
    if (shown_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    shown_ = true;
    std::fprintf(stderr, "\rcertify: %.*s: step %lld of %lld   ",
                 int(stage.size()), stage.data(),
                 (long long)std::min(done, total), (long long)total);
    std::fflush(stderr);
  }
  void erase() {
    std::lock_guard lock(mutex_);
    if (shown_) std::fprintf(stderr, "\r%60s\r", "");
    shown_ = false;
  }
  ~ProgressLine() { erase(); }

 private:
  std::mutex mutex_;
  std::chrono::steady_clock::time_point last_{};
  bool shown_ = false;
};

}  // namespace

int certify_command(const CertifyOptions& o) {
  if (o.contract == !o.scenario.empty())
    throw InputError("", 0, 0, "scenario",
                     o.contract
                         ? "--contract judges a trace alone: no scenario file"
                         : "a scenario file is required (or --contract)");
  if (o.contract && o.values_only)
    throw InputError("", 0, 0, "--values-only",
                     "applies to a scenario's trace, not to --contract");
  // A --junit path we could not write is refused before any judging.
  if (!o.junit.empty()) require_output_file(o.junit, "--junit");
  if (!o.html.empty()) require_output_file(o.html, "--html");
  if (o.contract) {
    const CertifyReport r = certify_contract(o.trace);
    if (!o.html.empty()) {
      ReportData d =
          contract_report_data(read_trace(o.trace), read_contract(o.trace));
      d.certify = r;
      write_output_file(o.html, report_html(d), "--html");
    }
    if (o.quiet)
      std::printf("%s\n", r.verdict.c_str());
    else
      std::printf("%s", contract_text(r, o.top).c_str());
    if (!o.junit.empty())
      write_output_file(o.junit, certify_junit(r), "--junit");
    std::fflush(stdout);
    if (!o.quiet) std::fprintf(stderr, "certify: %.2f s\n", r.seconds);
    return r.pass ? 0 : 1;
  }
  const Scenario s = parse_scenario_file(o.scenario);
  CertifyConfig cfg;
  cfg.run = o.run;
  cfg.fp64 = o.precision == "fp64";
  cfg.values_only = o.values_only;
  if (o.precision == "bf16" || o.precision == "fp16")
    cfg.autocast = o.precision;
  cfg.bound_arith = o.bound_arith == "mpfr" ? BoundArith::mpfr : BoundArith::dd;
  cfg.threads = o.threads;
  if (!o.steps.empty()) cfg.steps = parse_step_range(o.steps, "--steps");
  ProgressLine line;
  if (!o.quiet && isatty(STDERR_FILENO))
    cfg.progress = [&line](std::string_view stage, int64_t done,
                           int64_t total) { line.update(stage, done, total); };
  const CertifyReport r = certify(s, o.trace, cfg);
  line.erase();
  if (!o.part.empty())
    write_output_file(o.part, certify_part_text(r, s.digest, o.bound_arith),
                      "--part");
  if (!o.html.empty()) {
    // The trace read again through the one reader, for its curves.
    ReportData d = report_data(read_trace(o.trace), s);
    d.certify = r;
    write_output_file(o.html, report_html(d), "--html");
  }
  return report(r, o.quiet, o.top, o.junit);
}

int certify_merge_command(const CertifyMergeOptions& o) {
  return report(certify_merge(o.parts), o.quiet, o.top, o.junit);
}

}  // namespace accumcheck::cli
