// Internal to the trace readers (verify/trace/): values.bin (the format is
// described in verify/trace/trace.hpp), read by verify/trace/values_bin.cpp.
#pragma once

#include <string>
#include <vector>

#include "sim/layout.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::trace_detail {

// Reads `path` into t.binary and the runs' blocks (t.runs, created in
// order of first appearance after the events' runs).  InputError naming
// "path:byte N" on anything malformed.
void read_values_bin(Trace& t, const std::string& path);

// gather_steps for a run of a values.bin trace.
std::vector<TraceStep> gather_blocks(const Trace& t, const TraceRun& run,
                                     const ParamLayout& layout, int64_t rank);

// The run's state blocks (rank 0) into st.blocks, decoded; st.present
// when there are any.
void gather_state_blocks(const Trace& t, const TraceRun& run,
                         const ParamLayout& layout, StateSection& st);

// The state.csv kind of values.bin block kind 2-4 ("" for another).
std::string_view state_block_kind(uint32_t kind);
// The number of state block kinds (2 .. 1 + kStateBlockKinds).
inline constexpr int kStateBlockKinds = 3;

// "path:byte N", the file part of a values.bin message.
std::string byte_at(const std::string& path, int64_t offset);

}  // namespace accumcheck::trace_detail
