// `accumcheck check`: the property battery (properties/) from the command
// line: a progress line on a terminal, a summary table, counterexamples
// written as ready-to-run scenario files.
#include <rapidcheck.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cli/commands.hpp"
#include "oracle/oracle.hpp"
#include "properties/harness.hpp"
#include "sim/atomic_file.hpp"
#include "sim/errors.hpp"

namespace accumcheck::cli {

namespace {

class Progress : public rc::detail::TestListener {
 public:
  Progress(std::string label, int cases, bool tty)
      : label_(std::move(label)), cases_(cases), tty_(tty) {}
  void onTestCaseFinished(const rc::detail::CaseDescription& d) override {
    if (d.result.type == rc::detail::CaseResult::Type::Success) ++done_;
    if (tty_)
      std::fprintf(stderr, "\r%s %d/%d   ", label_.c_str(), done_, cases_);
  }
  void onShrinkTried(const rc::detail::CaseDescription&,
                     bool accepted) override {
    if (accepted) ++shrinks_;
    if (tty_)
      std::fprintf(stderr, "\r%s shrinking (%d)   ", label_.c_str(), shrinks_);
  }
  void onTestFinished(const rc::detail::TestMetadata&,
                      const rc::detail::TestResult&) override {
    if (tty_) std::fprintf(stderr, "\r%*s\r", int(label_.size()) + 24, "");
  }

 private:
  std::string label_;
  int cases_, done_ = 0, shrinks_ = 0;
  bool tty_;
};

}  // namespace

int check_command(const CheckOptions& o) {
  using namespace accumcheck::properties;
  if (o.engine == "cuda") require_cuda();
  // RapidCheck reads (and prints) its configuration once, on first use:
  // make what it prints the seed this run uses.
  const std::string rc_params = "seed=" + std::to_string(o.seed) +
                                " max_success=" + std::to_string(o.cases);
  setenv("RC_PARAMS", rc_params.c_str(), 1);
  set_oracle_digits(o.digits);
  std::vector<const Property*> chosen;
  for (const Property& p : all_properties())
    if ((o.property.empty() || p.name.find(o.property) != std::string::npos) &&
        (o.engine == p.engine || (o.engine == "all" && !p.needs_gpu)))
      chosen.push_back(&p);
  if (chosen.empty())
    throw InputError("", 0, 0, "--property",
                     "no property matches '" + o.property + "' on engine " +
                         o.engine + " (accumcheck check --list shows them)");
  if (o.list) {
    for (const Property* p : chosen)
      std::printf("%-48s %-7s %s\n", p->name.c_str(), p->engine.c_str(),
                  p->claim.c_str());
    return 0;
  }
  // Counterexamples go there: a path we could not write is refused now.
  require_output_folder(o.out, "--out");
  const bool tty = isatty(2);
  std::printf("accumcheck check: %zu properties, %d cases each, seed %llu\n",
              chosen.size(), o.cases, (unsigned long long)o.seed);
  std::fflush(stdout);
  int failures = 0;
  size_t index = 0;
  for (const Property* p : chosen) {
    ++index;
    rc::detail::TestParams params;
    params.seed = o.seed;
    params.maxSuccess = o.cases;
    params.maxSize = 100;
    rc::detail::TestMetadata meta;
    meta.id = p->name;
    meta.description = p->claim;
    char label[160];
    std::snprintf(label, sizeof label, "[%zu/%zu] %s", index, chosen.size(),
                  p->name.c_str());
    Progress progress(label, o.cases, tty);
    const auto result = rc::detail::checkProperty(
        rc::detail::toProperty(p->body), meta, params, progress);
    if (result.template is<rc::detail::SuccessResult>()) continue;
    ++failures;
    std::ostringstream msg;
    rc::detail::printResultMessage(result, msg);
    std::printf("FAIL %s: %s\n%s\n", p->name.c_str(), p->claim.c_str(),
                msg.str().c_str());
    if (result.template is<rc::detail::FailureResult>()) {
      const auto& f = result.template get<rc::detail::FailureResult>();
      for (const auto& [type, value] : f.counterExample)
        if (value.find("[model]") != std::string::npos) {
          namespace fs = std::filesystem;
          const fs::path path = fs::path(o.out) / (p->name + ".toml");
          write_output_file(path.string(),
                            "# shrunk counterexample of property " + p->name +
                                "\n" + value + "\n",
                            "--out");
          std::printf("counterexample: %s (run it with: accumcheck run %s)\n",
                      path.string().c_str(), path.string().c_str());
        }
    }
    std::printf(
        "reproduce: accumcheck check --property %s --seed %llu --cases %d\n",
        p->name.c_str(), (unsigned long long)o.seed, o.cases);
  }
  std::printf("\n%-48s %6s %14s %12s\n", "property", "cases", "worst err/tol",
              "min gap/tol");
  for (const auto& [name, s] : property_stats()) {
    char gap[32] = "-";
    if (s.min_gap_ratio >= 0)
      std::snprintf(gap, sizeof gap, "%.3g", s.min_gap_ratio);
    std::printf("%-48s %6lld %14.3g %12s\n", name.c_str(), (long long)s.cases,
                s.worst_ratio, gap);
  }
  std::printf("\n%zu passed, %d failed\n", chosen.size() - size_t(failures),
              failures);
  return failures ? 1 : 0;
}

}  // namespace accumcheck::cli
