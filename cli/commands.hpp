// The `accumcheck` subcommands.  Each returns the process exit code:
// 0 success (the verdict holds), 1 the verdict does not hold, 2 bad input.
#pragma once

#include <string>

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
  std::string precision = "fp32";  // fp32 | fp64
  int top = 5;                     // candidates shown in the ranking
  bool quiet = false;
  bool contract = false;  // the contract tier (verify/contract.hpp)
};
int certify_command(const CertifyOptions& o);

}  // namespace accumcheck::cli
