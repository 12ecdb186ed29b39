// `accumcheck memory`: where training memory goes, for the models
// accumcheck knows (MLPs; the token model), per micro-batch size b and
// accumulation K, as PyTorch 1.13 on the CPU allocates it.
//
// Persistent: parameters (4P bytes), gradients (4P: .grad lives across
// the whole window; accumulation adds into it and cannot free it),
// optimizer states (SGD with momentum: 4P; Adam/AdamW: exp_avg and
// exp_avg_sq, 8P, plus a 4-byte step tensor per parameter tensor), and
// with mixed precision (a prediction only, not measured on the CPU):
// 2-byte parameters and gradients plus 4-byte master weights.
// Per micro-batch: the batch itself and the activations autograd saves
// for backward (proportional to b, independent of K).  The peak is found
// by replaying the allocations of one steady-state window (forward,
// backward node by node, the optimizer step tensor by tensor) exactly as
// PyTorch 1.13's kernels and autograd engine make and free them; each rule
// is written beside its op in verify/teach/memory.cpp.  adapters/pytorch/
// measure_memory.py measures the same quantities through the allocator
// (CTest Memory.*).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/scenario.hpp"

namespace accumcheck {

struct MemoryRow {
  int64_t b = 0, K = 0;
  int64_t params = 0, grads = 0, states = 0, master = 0;  // bytes
  int64_t data = 0;         // one micro-batch's inputs and targets
  int64_t activations = 0;  // held from the forward to the backward
  int64_t peak = 0;         // the maximum live bytes over a window
  std::string peak_at;      // where it happens ("backward 0 (Linear)")
};

// One row (b, K) for the scenario's model and optimizer.  InputError for a
// model the accounting does not cover (dropout).
MemoryRow memory_row(const Scenario& s, int64_t b, int64_t K,
                     bool mixed_precision = false);

// The table for every (b, K), as text; then the seeds' claims adjudicated
// with these numbers (seed 002's table, seed 004's "Adam costs
// parameters x 3", seed 000's "accumulation saves only activations").
std::string memory_text(const Scenario& s,
                        const std::vector<std::pair<int64_t, int64_t>>& bk,
                        bool mixed_precision);

// One row as "key value" lines (for the PyTorch comparison in CTest).
std::string memory_row_kv(const MemoryRow& r);

}  // namespace accumcheck
