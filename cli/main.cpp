// accumcheck: the command line.  See docs/commands.md.
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "cli/commands.hpp"
#include "cli/scenario_dir.hpp"
#include "sim/errors.hpp"
#include "sim/limits.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define ACCUMCHECK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ACCUMCHECK_ASAN 1
#endif
#endif

namespace {

// certify's memory: it decodes the trace into parameter-sized vectors and
// keeps Oracle states of the same size per thread; glibc's defaults give
// those fresh 4 KiB pages (each first touch a page fault, about 13 us on
// the reference VM) and return freed memory to the system.  With
// transparent huge pages for malloc's memory (on systems whose THP mode is
// madvise), no trimming of the heap and allocations up to 32 MiB from the
// heap, certify of a 92,816-parameter, 20-step trace took 0.63 instead of
// 0.99 s of CPU on one thread (docs/certify-at-scale.md).  Kept as glibc
// does it, unless GLIBC_TUNABLES is already set (the user's own choice) or
// ACCUMCHECK_MALLOC_DEFAULTS=1; not under AddressSanitizer, whose
// allocator is not glibc's.  Two ways, by the trace's size:
//  - a values file up to kInProcessValuesBytes: in this process, with
//    mallopt and a heap grown once by a reserve advised MADV_HUGEPAGE (only
//    virtual until touched).  A second process start would cost about 7 of
//    a 1k-parameter trace's 60 ms; what a thread's own arena allocates
//    keeps 4 KiB pages, which at these sizes is little.
//  - a larger one: glibc's tunables (glibc.malloc.hugetlb=1, which also
//    advises the threads' arenas), read at process start only, so certify
//    runs itself again once with them set.  ACCUMCHECK_MALLOC_RUN_AGAIN=1
//    takes this way whatever the size (StateCli.malloc_tuning tests both).
#ifndef ACCUMCHECK_ASAN
constexpr std::uintmax_t kInProcessValuesBytes = 64u << 20;

std::uintmax_t values_file_bytes(const std::string& trace) {
  std::uintmax_t most = 0;
  for (const char* name : {"values.bin", "values.csv"}) {
    std::error_code ec;
    const auto n =
        std::filesystem::file_size(std::filesystem::path(trace) / name, ec);
    if (!ec && n > most) most = n;
  }
  return most;
}

// The heap grown once by `reserve` bytes (mallopt's top pad on the next
// growth) and that range advised for huge pages, as glibc.malloc.hugetlb=1
// advises each growth; later growth (beyond the reserve) keeps 4 KiB pages.
void huge_page_heap(std::size_t reserve) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  mallopt(M_TOP_PAD, static_cast<int>(reserve));
  const auto before = reinterpret_cast<std::uintptr_t>(sbrk(0));
  // Larger than the top chunk of a fresh heap, so that the heap grows
  // (volatile: a malloc freed unused may be left out by the compiler).
  void* volatile grow = std::malloc(1 << 20);
  std::free(grow);
  const auto after = reinterpret_cast<std::uintptr_t>(sbrk(0));
  mallopt(M_TOP_PAD, 64 << 20);
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t from = (before + page - 1) & ~(page - 1);
  if (after > from)  // the advice is a hint: a refusal changes nothing else
    (void)madvise(reinterpret_cast<void*>(from), after - from, MADV_HUGEPAGE);
}

void run_again_with_tunables(char** argv) {
  if (setenv("GLIBC_TUNABLES",
             "glibc.malloc.hugetlb=1:glibc.malloc.trim_threshold=4294967295:"
             "glibc.malloc.mmap_threshold=33554432",
             1) != 0)
    return;
  // By the executable's own path where it is still this process's file,
  // so that the process keeps its name (run as /proc/self/exe, ps and top
  // call it "exe").
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  struct stat a {
  }, b{};
  if (len > 0) {
    self[len] = '\0';
    if (stat(self, &a) == 0 && stat("/proc/self/exe", &b) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      execv(self, argv);
  }
  execv("/proc/self/exe", argv);
  unsetenv("GLIBC_TUNABLES");  // no /proc: go on with the defaults
}

#endif  // ACCUMCHECK_ASAN

void tune_malloc_for_certify(const std::string& trace, char** argv) {
#ifndef ACCUMCHECK_ASAN
  if (std::getenv("GLIBC_TUNABLES") ||
      std::getenv("ACCUMCHECK_MALLOC_DEFAULTS"))
    return;
  const std::uintmax_t values = values_file_bytes(trace);
  if (values > kInProcessValuesBytes ||
      std::getenv("ACCUMCHECK_MALLOC_RUN_AGAIN")) {
    run_again_with_tunables(argv);
    return;
  }
  // The reserve is address space, touched only as used.  The heap's peak
  // was 3.5x to 5x the values file (1k to 100k parameters) while
  // values.bin was read into it; mapped (FileBytes), it is 0.2x to 1.5x.
  huge_page_heap(static_cast<std::size_t>(8 * values + (64u << 20)));
#else
  (void)trace;
  (void)argv;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  using namespace accumcheck::cli;
  CLI::App app{
      "accumcheck: a deterministic simulator and verification suite for "
      "gradient accumulation.\nExit codes: 0 success / verdict holds, 1 "
      "verdict does not hold, 2 bad input, 3 internal error."};
  app.set_version_flag("--version", "accumcheck " ACCUMCHECK_VERSION);
  app.require_subcommand(1);

  RunOptions run;
  auto* run_cmd = app.add_subcommand(
      "run",
      "Replay a scenario: large-batch reference | correct accumulation | the "
      "scenario's trainer, side by side per window; write the trace CSVs and "
      "check the scenario's [expect] verdict.");
  run_cmd
      ->add_option(
          "scenario", run.scenario,
          "scenario file (.toml) or a scenario's name (accumcheck list)")
      ->required();
  run_cmd
      ->add_option("--engine", run.engine,
                   "engine that runs the table and the trace: oracle "
                   "(Boost.Multiprecision), device (float32 kernels on the "
                   "CPU), cuda (float32 kernels on a GPU); the verdict is "
                   "always judged by the oracle")
      ->check(CLI::IsMember({"oracle", "device", "cuda"}))
      ->capture_default_str();
  run_cmd->add_option("--out", run.out,
                      "trace directory (default: out/<scenario name>)");
  run_cmd
      ->add_option("--steps", run.steps,
                   "stop after N optimizer steps (default: the scenario's)")
      ->check(CLI::Range(0LL, 1LL << 40));
  run_cmd
      ->add_option("--digits", run.digits, "oracle precision in decimal digits")
      ->check(CLI::Range(20u, 1000u))
      ->capture_default_str();
  run_cmd->add_option("--rows", run.rows, "table rows before sampling")
      ->check(CLI::Range(4, 100000))
      ->capture_default_str();
  run_cmd->add_flag("--quiet", run.quiet, "print the verdict line only");
  run_cmd->add_flag("--no-trace", run.no_trace, "write no trace files");
  run_cmd->add_option("--html", run.html,
                      "also write the trace's HTML report (plots) to this "
                      "file");

  ListOptions list;
  auto* list_cmd = app.add_subcommand(
      "list", "List the scenarios with a one-line story each.");
  list_cmd->add_option("--dir", list.dir,
                       "scenario folder (default: the installed scenarios, or "
                       "this checkout's scenarios/)");

  auto* limits_cmd = app.add_subcommand(
      "limits",
      "Print the limits table: the largest scenario and input files accepted, "
      "each with its reason (raise one with ACCUMCHECK_LIMITS=key=value).");

  CheckOptions check;
  auto* check_cmd = app.add_subcommand(
      "check",
      "Run the property battery (RapidCheck): equivalence to the large batch, "
      "loss normalization, zero_grad timing, partial windows, scheduler drift, "
      "clipping, decay, inertness. Failures are shrunk and written as scenario "
      "files.");
  check_cmd->add_option("--cases", check.cases, "cases per property")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  check_cmd->add_option("--seed", check.seed, "RapidCheck seed (>= 0)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // A negative seed would wrap to 2^64 - n: refused.
            unsigned long long x = 0;
            const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
            if (v.empty() || r.ec != std::errc() ||
                r.ptr != v.data() + v.size())
              return "expected an integer in 0.." + std::to_string(~0ULL) +
                     ", got " + v;
            return {};
          },
          "UINT64"))
      ->capture_default_str();
  check_cmd->add_option("--property", check.property,
                        "only properties whose name contains this");
  check_cmd
      ->add_option(
          "--engine", check.engine,
          "which engine's properties: all (oracle and device), oracle, "
          "device (float32 kernels on the CPU), cuda (the same on a GPU)")
      ->check(CLI::IsMember({"all", "oracle", "device", "cuda"}))
      ->capture_default_str();
  check_cmd->add_option("--out", check.out, "where shrunk counterexamples go")
      ->capture_default_str();
  check_cmd
      ->add_option("--digits", check.digits,
                   "oracle precision in decimal digits")
      ->check(CLI::Range(20u, 1000u))
      ->capture_default_str();
  check_cmd->add_flag("--list", check.list, "list the properties and exit");

  ExportOptions exp;
  auto* export_cmd = app.add_subcommand(
      "export",
      "Write everything an outside trainer needs to train on a scenario: "
      "data, initial parameters (PyTorch names), the micro-batch order, "
      "hyperparameters, the lr per step, the scenario and its digest (tidy "
      "CSV). Warns when the scenario cannot tell pitfalls apart.");
  export_cmd
      ->add_option(
          "scenario", exp.scenario,
          "scenario file (.toml) or a scenario's name (accumcheck list)")
      ->required();
  export_cmd->add_option("--out", exp.out, "bundle folder")->required();
  export_cmd->add_flag("--quiet", exp.quiet, "print warnings only");

  CertifyOptions cert;
  auto* certify_cmd = app.add_subcommand(
      "certify",
      "Judge an outside trainer's trace step by step, teacher-forced on the "
      "micro-batches it drew, against the scenario's accepted semantics "
      "(PASS/FAIL), with its order and coverage and its lr as checks of "
      "their own; on FAIL rank every pitfall and pair of pitfalls by "
      "distance to the trace, or say that no modelled pitfall explains it "
      "and give model-free evidence. Exit 0 pass, 1 fail, 2 bad input (or "
      "something the recorder could not see).");
  certify_cmd->add_option(
      "scenario", cert.scenario,
      "scenario file (.toml) or a scenario's name (accumcheck "
      "list); not with --contract");
  certify_cmd->add_flag(
      "--contract", cert.contract,
      "the contract tier: judge a trace written by a contract recorder "
      "(accumcheck_torch's or accumcheck_jax's ContractRecorder, the "
      "framework integrations: any model; no scenario)");
  certify_cmd->add_option("--trace", cert.trace, "trace folder")->required();
  certify_cmd->add_option("--run", cert.run,
                          "run in the trace (default: its only run, or the "
                          "last one)");
  certify_cmd->add_option("--junit", cert.junit, "write JUnit XML here");
  certify_cmd
      ->add_option("--precision", cert.precision,
                   "the trainer's arithmetic: fp32 (the derived float32 "
                   "bound), fp64 (that bound scaled by 2^-29), bf16 or fp16 "
                   "(forwards and backwards under torch.autocast: the "
                   "gradient bound scaled by error_model's bf16_bound_scale "
                   "/ fp16_bound_scale, the float32 optimizer step's kept)")
      ->check(CLI::IsMember({"fp32", "fp64", "bf16", "fp16"}))
      ->capture_default_str();
  certify_cmd->add_option("--top", cert.top, "candidates shown on FAIL")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  certify_cmd->add_flag("--quiet", cert.quiet, "print the verdict only");
  certify_cmd->add_flag(
      "--values-only", cert.values_only,
      "judge a run that has no events.csv rows on its values alone (the "
      "call pattern is then NOT checked, as the verdict says); without it "
      "such a trace is refused (exit 2): a recorder always writes events, "
      "so a trace without them is broken or altered");
  certify_cmd
      ->add_option("--bound-arith", cert.bound_arith,
                   "the numbers the Tracked float32 bound is computed in: dd "
                   "(double-double, 106 bits, fast) or mpfr (40 digits)")
      ->check(CLI::IsMember({"dd", "mpfr"}))
      ->capture_default_str();
  certify_cmd
      ->add_option("--threads", cert.threads,
                   "judge steps on this many threads (0: every core); the "
                   "output is the same for every count")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  certify_cmd->add_option(
      "--steps", cert.steps,
      "judge only optimizer steps A..B-1 (A:B; A: or :B open-ended), e.g. one "
      "part of a CI matrix; the step count and call pattern are still "
      "checked whole");
  certify_cmd->add_option("--part", cert.part,
                          "write this run's result as a part file for "
                          "`accumcheck certify-merge`");

  CertifyMergeOptions merge;
  auto* merge_cmd = app.add_subcommand(
      "certify-merge",
      "Merge the part files of `certify --steps A:B --part FILE` (run on "
      "several machines) into one verdict and one JUnit file: the same "
      "checks, verdict and exit code as one certify over every step. Exit 0 "
      "pass, 1 fail, 2 bad input (parts that do not cover the trace's steps "
      "exactly once, or come from different scenarios or traces).");
  merge_cmd->add_option("parts", merge.parts, "part files")->required();
  merge_cmd->add_option("--junit", merge.junit, "write JUnit XML here");
  merge_cmd->add_option("--top", merge.top, "candidates shown on FAIL")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  merge_cmd->add_flag("--quiet", merge.quiet, "print the verdict only");
  certify_cmd->add_option("--html", cert.html,
                          "write an HTML report: the verdict, what a FAIL "
                          "behaves like (explain's entry: the story and the "
                          "fix), the evidence, error/bound per step and "
                          "tensor, the closest candidates (all of them "
                          "collapsed) and the trace's curves; with --contract "
                          "each step's micro-batch weights, lr and clip "
                          "factors");

  ReportOptions rep;
  auto* report_cmd = app.add_subcommand(
      "report",
      "Write one self-contained HTML file (opens offline) with the plots of "
      "a trace: loss per window, relative distance to the large batch (log), "
      "lr and gradient norm per optimizer step; the scenario's story, "
      "settings and pitfall on top. A contract-tier trace: its verdict, "
      "each step's micro-batch weights, lr and clip factors.");
  report_cmd->add_option("trace", rep.trace, "trace folder")->required();
  report_cmd->add_option("--out", rep.out,
                         "HTML file (default: <trace>/report.html)");
  report_cmd->add_option("--scenario", rep.scenario,
                         "the trace's scenario file (default: scenarios/"
                         "<the scenario the trace names>.toml)");

  ExplainOptions expl;
  auto* explain_cmd = app.add_subcommand(
      "explain",
      "Explain a pitfall or lesson: the story, the wrong and the right loop "
      "as a PyTorch diff, what the oracle predicts, the scenario to run, the "
      "field reports and the properties that guard it.");
  explain_cmd->add_option("pitfall", expl.id,
                          "pitfall id, pitfall ids joined by '+' (a "
                          "combination certify names), lesson (its -lesson "
                          "suffix may be left out) or scenario name");
  explain_cmd->add_flag("--list", expl.list, "list every entry");

  MemoryOptions mem;
  auto* memory_cmd = app.add_subcommand(
      "memory",
      "Training-memory breakdown of a scenario's model (PyTorch 1.13 CPU "
      "accounting): parameters, gradients, optimizer states, activations and "
      "the peak, for micro-batch sizes b and accumulation K; then the seeds' "
      "memory claims judged with the numbers.");
  memory_cmd
      ->add_option(
          "scenario", mem.scenario,
          "scenario file (.toml) or a scenario's name (accumcheck list)")
      ->required();
  memory_cmd
      ->add_option("--b", mem.b,
                   "micro-batch sizes (default: the "
                   "scenario's b*K split every power-of-two way)")
      ->delimiter(',')
      ->check(CLI::Range(1LL, 1LL << 30));
  memory_cmd->add_option("--k", mem.k, "accumulation steps")
      ->delimiter(',')
      ->check(CLI::Range(1LL, 1LL << 20));
  memory_cmd->add_flag("--mixed-precision", mem.mixed_precision,
                       "2-byte parameters, gradients and activations with "
                       "4-byte master weights (a prediction, not measured)");
  memory_cmd->add_flag("--kv", mem.kv,
                       "one row (one --b, one --k) as key/value lines");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    // A scenario may be named as `accumcheck list` shows it (certify-mlp)
    // instead of by its file: the installed or source tree's scenarios/.
    for (std::string* s : {&run.scenario, &exp.scenario, &cert.scenario,
                           &mem.scenario, &rep.scenario})
      *s = resolve_scenario(*s);
    if (*run_cmd) return run_command(run);
    if (*list_cmd) return list_command(list);
    if (*limits_cmd) {
      std::fputs(accumcheck::limits_text().c_str(), stdout);
      return 0;
    }
    if (*check_cmd) return check_command(check);
    if (*export_cmd) return export_command(exp);
    if (*certify_cmd) {
      tune_malloc_for_certify(cert.trace, argv);
      return certify_command(cert);
    }
    if (*merge_cmd) return certify_merge_command(merge);
    if (*report_cmd) return report_command(rep);
    if (*explain_cmd) return explain_command(expl);
    if (*memory_cmd) return memory_command(mem);
  } catch (const accumcheck::InputError& e) {
    std::fprintf(stderr, "accumcheck: %s\n", e.what());
    for (const std::string* s : {&run.scenario, &exp.scenario, &cert.scenario,
                                 &mem.scenario, &rep.scenario}) {
      const std::string hint = missing_scenario_hint(*s);
      if (!hint.empty()) std::fprintf(stderr, "accumcheck: %s\n", hint.c_str());
    }
    return 2;
  } catch (const std::exception& e) {
    // Not the user's input: a fault of accumcheck or of the machine.
    std::fprintf(stderr, "accumcheck: internal error: %s\n", e.what());
    return 3;
  }
  return 2;
}
