// Internal to verify/trace/: the headers of the trace's CSV files and the
// closed sets of names their rows may hold, shared by the writer
// (write.cpp) and the readers (read_*.cpp).  The format is described in
// verify/trace/trace.hpp.
#pragma once

#include <string_view>

#include "sim/run.hpp"

namespace accumcheck::trace_detail {

// The rank column, last, is optional (TraceWriter::with_ranks) in both
// files.
inline constexpr std::string_view kEventsHeader =
    "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm,sample_ids";
inline constexpr std::string_view kEventsHeaderV1 =
    "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm";
inline constexpr std::string_view kValuesHeader =
    "run,step,kind,tensor,index,value";
inline constexpr std::string_view kMetaHeader = "key,value";
// state.csv; the run column is optional when read (read_state).
inline constexpr std::string_view kStateHeader =
    "run,kind,step,tensor,index,value";
inline constexpr std::string_view kStateKinds[] = {
    "loss_scale",  "skipped",
    "opt_step",    "exp_avg",
    "exp_avg_sq",  "ema_update",
    "ema",         "running_mean",
    "running_var", "num_batches_tracked",
    "logged_loss"};
inline constexpr std::string_view kRequiredMeta[] = {
    "schema", "scenario",  "scenario_digest",
    "engine", "precision", "tool_version"};

inline constexpr EventKind kEventKinds[] = {
    EventKind::zero_grad,      EventKind::forward_backward,
    EventKind::clip,           EventKind::optimizer_step,
    EventKind::scheduler_step, EventKind::all_reduce,
    EventKind::unscale,        EventKind::scaler_update,
    EventKind::ema_update};

}  // namespace accumcheck::trace_detail
