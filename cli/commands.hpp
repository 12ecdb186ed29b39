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
  std::string property;         // substring filter on property names
  std::string engine = "all";   // all | oracle | device | cuda
  std::string out = "out/counterexamples";
  unsigned digits = 50;
  bool list = false;
};
int check_command(const CheckOptions& o);

}  // namespace accumcheck::cli
