// `accumcheck certify --contract TRACE`: the contract tier (DESIGN.md
// section 10).  Judges the gradient accumulation of any PyTorch model from
// what the contract recorder measured (verify/trace/trace.hpp ContractSection):
// each backward's gradient fitted as w_b * g_j, each step's consumed
// gradient fitted over the backward passes since the previous step (and
// what .grad kept of it), and the float64 replay of the optimizer.
//
// From these the measured weight W_{t,m} of micro-batch m in step t is
// composed (W_t = beta_t W_{t-1} + sum_b a_{t,b} w_b e_{m(b)}), with an
// uncertainty propagated the same way from each fit's bound (the error
// model's contract_* rows).  The prediction for each semantics (correct,
// every catalog pitfall, every pair) is the coefficient engine's
// (verify/contract/coefficient_engine.hpp) run through the one Trainer loop on
// the micro-batches the trainer drew (plus any the loader should have drawn and
// did not).  Distance of a semantics = max over steps and micro-batches of |W -
// P| / uncertainty (infinite when the step count or the parameter version of a
// g_j differs).  PASS: every fit within its bound and `correct` within
// distance 1.  On FAIL the candidates are ranked, the closest named with its
// margin (runner-up / best); when none is within 1 the model-free evidence
// comes first.
#pragma once

#include <string>

#include "verify/certify/certify.hpp"

namespace accumcheck {

// Reads the trace folder (meta.csv must say tier = contract) and judges
// it.  InputError on malformed input.
CertifyReport certify_contract(const std::string& trace_dir);

// The report as text: checks, verdict, diagnosis, the closest candidates.
std::string contract_text(const CertifyReport& r, int top = 5);

}  // namespace accumcheck
