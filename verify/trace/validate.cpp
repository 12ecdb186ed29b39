// A trace's values against a scenario's model (verify/trace/trace.hpp):
// value_ranks, locate_value, and gather_steps, which checks every value's
// tensor and index against the layout and that a step gives all of a
// kind's values or none.
#include <fmt/format.h>

#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/errors.hpp"
#include "verify/trace/trace.hpp"
#include "verify/trace/values_bin.hpp"

namespace accumcheck {

std::vector<int64_t> value_ranks(const TraceRun& run) {
  std::set<int64_t> ranks{0};
  for (const TraceValue& v : run.values) ranks.insert(v.rank);
  for (const TraceBlock& b : run.blocks) ranks.insert(b.rank);
  return {ranks.begin(), ranks.end()};
}

ValueWhere locate_value(const Trace& t, const TraceRun& run, int64_t step,
                        ValueKind kind, int64_t flat, const ParamLayout& layout,
                        int64_t rank) {
  if (t.binary) {
    for (const TraceBlock& b : run.blocks)
      if (b.step == step && b.kind == kind && b.rank == rank)
        return {
            trace_detail::byte_at(t.binary->path, t.binary->offset(b, flat)),
            0};
    return {t.binary->path, 0};
  }
  const TensorView& tv = layout.tensor_of(flat);
  for (const TraceValue& v : run.values)
    if (v.step == step && v.kind == kind && v.rank == rank &&
        v.tensor == tv.name && v.index == flat - tv.offset)
      return {t.values_path(), v.line};
  return {t.values_path(), 0};
}

std::vector<TraceStep> gather_steps(const Trace& t, const TraceRun& run,
                                    const ParamLayout& layout, int64_t rank) {
  if (t.binary) return trace_detail::gather_blocks(t, run, layout, rank);
  const std::string file = t.values_path();
  std::map<std::string, const TensorView*, std::less<>> tensors;
  for (const TensorView& v : layout.tensors) tensors[v.name] = &v;

  struct Step {
    int64_t step = 0;
    std::vector<double> grad, param;
  };
  std::vector<Step> steps;
  std::vector<int64_t> count_grad, count_param;  // per step
  std::vector<int64_t> last_line;
  for (const TraceValue& v : run.values) {
    if (v.rank != rank) continue;
    const auto it = tensors.find(v.tensor);
    if (it == tensors.end()) {
      std::string known;
      for (const TensorView& tv : layout.tensors) {
        if (!known.empty()) known += ", ";
        known += tv.name;
      }
      throw InputError(file, v.line, 0, "tensor",
                       fmt::format("unknown tensor '{}' for this scenario's "
                                   "model; expected one of {}",
                                   v.tensor, known));
    }
    const TensorView& tv = *it->second;
    if (v.index >= tv.size())
      throw InputError(
          file, v.line, 0, "index",
          fmt::format("index {} out of range for {} [{} x {}] "
                      "({} elements)",
                      v.index, tv.name, tv.rows, tv.cols, tv.size()));
    if (steps.empty() || steps.back().step != v.step) {
      steps.push_back(Step{v.step, {}, {}});
      count_grad.push_back(0);
      count_param.push_back(0);
      last_line.push_back(v.line);
    }
    Step& s = steps.back();
    std::vector<double>& dst = v.kind == ValueKind::grad ? s.grad : s.param;
    if (dst.empty())
      dst.assign(size_t(layout.total),
                 std::numeric_limits<double>::quiet_NaN());
    dst[size_t(tv.offset + v.index)] = v.value;
    ++(v.kind == ValueKind::grad ? count_grad : count_param).back();
    last_line.back() = v.line;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const auto& [count, kind] :
         {std::pair{count_grad[i], "grad"}, std::pair{count_param[i], "param"}})
      if (count != 0 && count != layout.total)
        throw InputError(
            file, last_line[i], 0, kind,
            fmt::format("run '{}' step {}: {} of {} {} values "
                        "given; expected all or none",
                        run.name, steps[i].step, count, layout.total, kind));
  }
  std::vector<TraceStep> out;
  out.reserve(steps.size());
  for (Step& st : steps)
    out.push_back({st.step, std::move(st.grad), std::move(st.param)});
  return out;
}

}  // namespace accumcheck
