// The `accumcheck` subcommands.  Each returns the process exit code:
// 0 success (the verdict holds), 1 the verdict does not hold, 2 bad input.
#pragma once

#include <string>
#include <vector>

namespace accumcheck::cli {

struct RunOptions {
  std::string scenario;
  std::string engine = "oracle";  // oracle | device | cuda
  std::string out;                // trace directory; default out/<name>
  long long steps = -1;           // stop after N optimizer steps
  unsigned digits = 50;           // oracle precision
  int rows = 40;                  // table rows before sampling
  bool quiet = false;             // the verdict line only
  bool no_trace = false;
  std::string html;  // also write the HTML report here (needs the trace)
};
int run_command(const RunOptions& o);
void require_cuda();  // throws InputError when --engine cuda cannot run

struct ListOptions {
  std::string dir;  // default: the scenarios/ folder of this checkout
};
int list_command(const ListOptions& o);

struct CheckOptions {
  int cases = 100;
  unsigned long long seed = 1;
  std::string property;        // substring filter on property names
  std::string engine = "all";  // all | oracle | device | cuda
  std::string out = "out/counterexamples";
  unsigned digits = 50;
  bool list = false;
};
int check_command(const CheckOptions& o);

struct ExportOptions {
  std::string scenario;
  std::string out;
  bool quiet = false;
};
int export_command(const ExportOptions& o);

struct CertifyOptions {
  std::string scenario;
  std::string trace;  // trace folder
  std::string run;    // run name in the trace; default: the only/last
  std::string junit;  // JUnit XML file, or ""
  std::string precision = "fp32";  // fp32 | fp64 | bf16 | fp16
  int top = 5;                     // candidates shown in the ranking
  bool quiet = false;
  std::string bound_arith = "dd";  // dd | mpfr: the Tracked bound's numbers
  int threads = 0;                 // 0: every core
  std::string steps;               // "A:B": judge optimizer steps A..B-1 only
  std::string part;                // write the judged range's part file here
  std::string html;          // write the HTML report (certify results + curves)
  bool contract = false;     // the contract tier (verify/contract/contract.hpp)
  bool values_only = false;  // judge a run without events on its values alone
};
int certify_command(const CertifyOptions& o);

struct CertifyMergeOptions {
  std::vector<std::string> parts;  // part files of `certify --steps --part`
  std::string junit;
  int top = 5;
  bool quiet = false;
};
int certify_merge_command(const CertifyMergeOptions& o);

struct ReportOptions {
  std::string trace;     // trace folder
  std::string out;       // HTML file; default <trace>/report.html
  std::string scenario;  // default: scenarios/<the trace's scenario>.toml
};
int report_command(const ReportOptions& o);

struct ExplainOptions {
  std::string id;  // pitfall id, lesson or scenario name
  bool list = false;
};
int explain_command(const ExplainOptions& o);

struct MemoryOptions {
  std::string scenario;
  std::vector<long long> b, k;  // default: the scenario's b*K split
  bool mixed_precision = false;
  bool kv = false;  // one row as key/value lines (for tests)
};
int memory_command(const MemoryOptions& o);

// Writes the HTML report of the trace in `trace_dir` (its scenario:
// `scenario_file`, or the one it names in scenarios/); returns the path.
std::string write_html_report(const std::string& trace_dir,
                              const std::string& scenario_file,
                              const std::string& out);

}  // namespace accumcheck::cli
