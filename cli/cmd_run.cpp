// `accumcheck run`: replay a scenario side by side and judge its verdict.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <system_error>

#include "cli/commands.hpp"
#include "cli/table.hpp"
#include "gpu/device.hpp"
#include "gpu/emulated.hpp"
#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "sim/atomic_file.hpp"
#include "sim/data.hpp"
#include "sim/errors.hpp"
#include "sim/experiment.hpp"
#include "sim/layout.hpp"
#include "sim/limits.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/trace/trace.hpp"
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "gpu/cuda/cuda_executor.hpp"
#endif

namespace accumcheck::cli {

namespace {

template <class Real>
void write_runs(const std::string& dir, const Scenario& s,
                const ParamLayout& layout, const Experiment<Real>& x,
                const std::string& engine, const std::string& precision,
                const std::string& executor = "") {
  TraceWriter w(s.name, s.digest, engine, precision);
  if (s.batching.ranks > 1) w.with_ranks();
  // The EMA's decay, as the recorder writes it (state.csv's ema rows).
  if (s.ema.enabled)
    w.add_meta("ema_decay", fmt::format("{:.17g}", s.ema.decay));
  // Determinism holds per machine, BLAS, GPU architecture and toolkit:
  // the trace says which.
  if (!executor.empty()) w.add_meta("executor", executor);
  add_run(w, x.reference, layout);
  add_run(w, x.correct, layout);
  if (x.accepted) add_run(w, *x.accepted, layout);
  add_run(w, x.trainer, layout);
  try {
    write_trace(dir, w);
  } catch (const std::system_error& e) {  // the user's path: exit 2
    throw InputError(dir, 0, 0, "--out", e.what());
  }
}

template <class Real>
void print_table(const Scenario& s, const Experiment<Real>& x,
                 const std::string& engine, int rows) {
  std::printf("%s  [%s]\n%s\n%s\n\n", s.name.c_str(), engine.c_str(),
              s.story.c_str(), describe(s).c_str());
  std::printf("%s\n", side_by_side(x, size_t(rows)).c_str());
}

}  // namespace

// --engine cuda needs this build's CUDA executor and a GPU; without
// either, one line says so (exit 2) before any work.
void require_cuda() {
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
  std::string why;
  if (!cuda_available(&why)) throw InputError("", 0, 0, "--engine cuda", why);
#else
  throw InputError(
      "", 0, 0, "--engine cuda",
      "this build has no CUDA executor (it was configured without nvcc "
      "or with -DACCUMCHECK_CUDA=OFF; the configure step's "
      "`accumcheck: no CUDA executor` line says which)");
#endif
}

int run_command(const RunOptions& o) {
  if (o.engine == "cuda") require_cuda();
  if (!o.html.empty() && o.no_trace)
    throw InputError("", 0, 0, "--html",
                     "the report is made from the trace: --html cannot go "
                     "with --no-trace");
  if (!o.html.empty()) require_output_file(o.html, "--html");
  Scenario s = parse_scenario_file(o.scenario);
  if (o.steps >= 0) s.batching.max_steps = o.steps;
  // Refused before any allocation: sizes, windows (after --steps), work.
  require_scenario_within_limits(s);
  if (const auto w = scenario_size(s).windows;
      w && s.expect.at_step >= *w)  // --steps cut the run before at_step
    throw InputError(s.path, 0, 0, "expect.at_step",
                     fmt::format("window {} is beyond this run's {} windows "
                                 "(--steps {}); judge it with a larger "
                                 "--steps or none",
                                 s.expect.at_step, *w, o.steps));
  const std::string dir = o.out.empty() ? "out/" + s.name : o.out;
  if (!o.no_trace) require_output_folder(dir, "--out");
  const Dataset data = make_dataset(s);
  const ParamLayout layout = layout_of(s.model);
  const std::vector<float> init = initial_parameters(s, layout);
  for (const std::string& note : data.notes)
    std::fprintf(stderr, "note: %s\n", note.c_str());

  // The verdict is always the oracle's: it is exact.
  set_oracle_digits(o.digits);
  const auto oracle = run_experiment(s, [&] {
    return std::make_unique<Oracle<OracleReal>>(s.model, data, init);
  });
  const Verdict verdict =
      judge(s, oracle, error_model::oracle_tolerance(o.digits));

  const std::string digits = std::to_string(o.digits) + " digits";
  if (o.engine == "oracle") {
    if (!o.quiet) print_table(s, oracle, "oracle, " + digits, o.rows);
    if (!o.no_trace) write_runs(dir, s, layout, oracle, "oracle", digits);
  } else if (o.engine == "device") {
    EmulatedExecutor exec;
    const auto device = run_experiment(s, [&] {
      return std::make_unique<Device<EmulatedExecutor>>(s.model, data, init,
                                                        exec);
    });
    if (!o.quiet) print_table(s, device, "device, float32, emulated", o.rows);
    if (!o.no_trace)
      write_runs(dir, s, layout, device, "device-emulated", "float32",
                 exec.describe());
  } else {
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
    const auto cuda = run_experiment(
        s, [&] { return std::make_unique<CudaDevice>(s.model, data, init); });
    if (!o.quiet)
      print_table(s, cuda, "cuda, float32, " + cuda_trace_header(), o.rows);
    if (!o.no_trace)
      write_runs(dir, s, layout, cuda, "cuda", "float32", cuda_trace_header());
#endif
  }
  std::printf("verdict (oracle, %s): %s\n", digits.c_str(),
              verdict.message.c_str());
  if (!o.quiet && !o.no_trace)
    std::printf("trace: %s/{events,values,meta}.csv\n", dir.c_str());
  if (!o.html.empty()) {
    const std::string file = write_html_report(dir, o.scenario, o.html);
    if (!o.quiet) std::printf("report: %s\n", file.c_str());
  }
  return verdict.holds ? 0 : 1;
}

}  // namespace accumcheck::cli
