// Certification in parts: `certify --steps A:B --part FILE` on several
// machines (a CI matrix), then `certify-merge PART...` into one report.
//
// Teacher forcing makes steps independent (verify/certify/certify.hpp): a part
// judges the accepted semantics on its range of optimizer steps only;
// every part checks the step count and the call pattern whole (cheap).
// The merged report has the checks of one certify over every step, in
// the same order (step count, each step's gradient and parameters, call
// pattern), the same verdict line and exit code, and JUnit with the same
// test cases.  On FAIL the diagnosis (the ranking of candidates) is the
// one computed by the part that holds the first failing step, over that
// part's steps; the merged text says so.
//
// Part file (text, `accumcheck-certify-part/1`): one `key<TAB>value` line
// per field, values escaped (\\, \t, \n); checks and candidates one line
// each.  Parts must agree on scenario digest, run, precision, bound
// arithmetic, trace and expected step counts, and together cover steps
// 0..n-1 exactly once; anything else is an InputError naming file:line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verify/certify/certify.hpp"

namespace accumcheck {

// "A:B", "A:", ":B" (InputError otherwise, naming `what`).
StepRange parse_step_range(const std::string& text, const std::string& what);

// The part file of a report judged on r.steps.
std::string certify_part_text(const CertifyReport& r,
                              const std::string& scenario_digest,
                              const std::string& bound_arith);

// Reads and checks the parts; the merged report (its seconds: the sum).
CertifyReport certify_merge(const std::vector<std::string>& files);

}  // namespace accumcheck
