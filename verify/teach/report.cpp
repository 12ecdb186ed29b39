// `accumcheck report`: the series of a trace (verify/teach/report.hpp).
#include "verify/teach/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "sim/errors.hpp"
#include "sim/layout.hpp"
#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "verify/teach/explain.hpp"

namespace accumcheck {

namespace {

double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double distance(const std::vector<double>& a, const std::vector<double>& ref) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i)
    s += (a[i] - ref[i]) * (a[i] - ref[i]);
  const double r = norm2(ref);
  return r > 0 ? std::sqrt(s) / r : kNaN;
}

// Per run: window losses and the optimizer steps taken by each cut.
struct Cuts {
  std::vector<double> loss;
  std::vector<int64_t> steps_by_end;  // optimizer steps taken by window end
  int64_t consumed = 0;               // samples over the whole run
};

Cuts cut_run(const TraceRun& run, const std::vector<int64_t>& ends) {
  Cuts c;
  c.loss.assign(ends.size(), kNaN);
  c.steps_by_end.assign(ends.size(), 0);
  std::vector<double> sum(ends.size(), 0), weight(ends.size(), 0);
  int64_t consumed = 0, steps = 0;
  size_t w = 0;
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.kind == EventKind::forward_backward) {
      // The first forward past a cut closes the windows before it.
      while (w < ends.size() && consumed >= ends[w])
        c.steps_by_end[w++] = steps;
      consumed += e.samples;
      if (w < ends.size() && std::isfinite(e.loss)) {
        const double items = double(e.tokens > 0 ? e.tokens : e.samples);
        sum[w] += e.loss * items;
        weight[w] += items;
      }
    } else if (e.kind == EventKind::optimizer_step) {
      ++steps;
    }
  }
  while (w < ends.size() && consumed >= ends[w]) c.steps_by_end[w++] = steps;
  for (; w < ends.size(); ++w) c.steps_by_end[w] = -1;  // not reached
  for (size_t i = 0; i < ends.size(); ++i)
    if (weight[i] > 0) c.loss[i] = sum[i] / weight[i];
  c.consumed = consumed;
  return c;
}

}  // namespace

ReportData report_data(const Trace& t, const Scenario& s) {
  ReportData d;
  d.scenario = s.name;
  d.story = s.story;
  d.settings = describe(s);
  d.engine = t.meta_value("engine");
  d.precision = t.meta_value("precision");
  for (Pitfall p : s.trainer.pitfalls) d.pitfalls.emplace_back(pitfall_id(p));
  if (d.pitfalls.empty() && find_explain(s.name)) d.pitfalls.push_back(s.name);

  // Window ends in consumed samples, from the plan (the reference's
  // windows); events count one forward_backward per rank shard.
  std::vector<int64_t> ends;
  int64_t total = 0;
  make_plan(s).visit([&](int64_t, const EpochPlan& e) {
    for (const Window& w : e.windows) ends.push_back(total += w.items());
    return true;
  });

  const ParamLayout layout = layout_of(s.model);
  std::vector<Cuts> cuts;
  std::vector<std::map<int64_t, std::vector<double>>> params(t.runs.size());
  int64_t reached = 0;
  for (size_t r = 0; r < t.runs.size(); ++r) {
    const TraceRun& run = t.runs[r];
    cuts.push_back(cut_run(run, ends));
    ReportRun rr;
    rr.name = run.name;
    for (const TraceEvent& te : run.events)
      if (te.event.kind == EventKind::optimizer_step)
        rr.step_lr.push_back(te.event.lr);
    for (TraceStep& st : gather_steps(t, run, layout)) {
      if (st.step >= int64_t(rr.step_grad_norm.size()))
        rr.step_grad_norm.resize(size_t(st.step + 1), kNaN);
      if (!st.grad.empty())
        rr.step_grad_norm[size_t(st.step)] = norm2(st.grad.vector());
      if (!st.param.empty()) params[r][st.step] = st.param.vector();
    }
    for (size_t w = 0; w < ends.size(); ++w)
      if (cuts.back().steps_by_end[w] >= 0)
        reached = std::max<int64_t>(reached, int64_t(w) + 1);
    d.runs.push_back(std::move(rr));
  }
  d.windows = reached;

  // Distances to the reference's parameters at each window end.
  const TraceRun* ref = t.run("reference");
  const size_t ref_i = ref ? size_t(ref - t.runs.data()) : 0;
  for (size_t r = 0; r < t.runs.size(); ++r) {
    ReportRun& rr = d.runs[r];
    rr.window_loss.assign(cuts[r].loss.begin(),
                          cuts[r].loss.begin() + d.windows);
    rr.window_dist.assign(size_t(d.windows), kNaN);
    if (!ref || r == ref_i) continue;
    for (size_t w = 0; w < size_t(d.windows); ++w) {
      const int64_t mine = cuts[r].steps_by_end[w];
      const int64_t theirs = cuts[ref_i].steps_by_end[w];
      const auto a = params[r].find(mine - 1),
                 b = params[ref_i].find(theirs - 1);
      if (mine <= 0 || theirs <= 0 || a == params[r].end() ||
          b == params[ref_i].end())
        continue;
      rr.window_dist[w] = distance(a->second, b->second);
    }
  }
  return d;
}

ReportData contract_report_data(const Trace& t, const ContractSection& c) {
  if (t.meta_value("tier") != "contract")
    throw InputError(t.meta_path(), 0, 0, "tier",
                     "not a contract-tier trace (meta.csv has no "
                     "'tier,contract')");
  ReportData d;
  ReportContract rc;
  try {
    rc.accumulation = std::stoll(t.meta_value("accumulation"));
  } catch (...) {
    throw InputError(t.meta_path(), 0, 0, "accumulation",
                     "expected an integer >= 1");
  }
  rc.ranks = c.ranks();
  rc.micro_batches = int64_t(c.micro.size());
  d.scenario = "contract-tier trace";
  // The recorder as its trace names itself (tool_version's first word:
  // accumcheck_torch-..., accumcheck_jax-...).
  std::string recorder = t.meta_value("tool_version");
  recorder = recorder.substr(0, recorder.find('-'));
  d.story = fmt::format(
      "Recorded by {}'s ContractRecorder around the real trainer: which "
      "micro-batch gradients g_j enter each optimizer step, with which "
      "weights, the lr of each step and each clip factor.",
      recorder.empty() ? "a contract recorder" : recorder);
  const std::string items = t.meta_value("items");
  std::string settings = fmt::format(
      "K={} items={} parameters={} ranks={} micro-batches={} steps={}",
      rc.accumulation, items.empty() ? "samples" : items,
      t.meta_value("parameters"), rc.ranks, rc.micro_batches,
      c.steps.front().size());
  for (const char* key : {"lr", "schedule_kind", "clip", "accept", "ema"})
    if (const std::string v = t.meta_value(key); !v.empty())
      settings += fmt::format(" {}={}", key, v);
  d.settings = settings;
  d.engine = t.meta_value("engine");
  d.precision = t.meta_value("precision");
  // Rank 0's steps: W_t = a_prev * W_{t-1} + sum_b a_b w_b e_{micro(b)}.
  std::map<int64_t, double> prev;
  for (size_t i = 0; i < c.steps.front().size(); ++i) {
    const ContractStep& st = c.steps.front()[i];
    std::map<int64_t, double> w;
    for (const ContractStep::Coef& k : st.coefs)
      if (k.backward < 0) {
        for (const auto& [j, x] : prev) w[j] += k.a * x;
      } else if (size_t(k.backward) < c.backward.size()) {
        const ContractBackward& b = c.backward[size_t(k.backward)];
        w[b.micro] += k.a * b.weight;
      }
    double top = 0;
    for (const auto& [j, x] : w) top = std::max(top, std::abs(x));
    ReportContractStep rs;
    rs.lr = st.lr;
    for (const auto& [j, x] : w)
      if (std::abs(x) > 1e-3 * top && j >= 0 && j < rc.micro_batches) {
        rs.micro.push_back(j);
        rs.items += c.micro[size_t(j)].items;
      }
    for (int64_t j : rs.micro) rs.weight_n.push_back(w[j] * double(rs.items));
    for (const ContractClip& cl : c.clips)
      if (cl.rank == 0 && cl.version == int64_t(i))
        rs.clip.push_back(cl.factor);
    rc.steps.push_back(std::move(rs));
    prev = std::move(w);
  }
  d.contract = std::move(rc);
  return d;
}

Scenario scenario_of_trace(const Trace& t, const std::string& scenario_file,
                           const std::string& scenario_dir) {
  std::string path = scenario_file;
  const std::string name = t.meta_value("scenario");
  if (path.empty()) {
    path = scenario_dir + "/" + name + ".toml";
    if (!std::filesystem::exists(path))
      throw InputError(t.meta_path(), 0, 0, "scenario",
                       fmt::format("the trace names scenario '{}', but {} does "
                                   "not exist: pass --scenario FILE",
                                   name, path));
  }
  Scenario s = parse_scenario_file(path);
  if (t.meta_value("scenario_digest") != s.digest)
    throw InputError(
        t.meta_path(), 0, 0, "scenario_digest",
        fmt::format("the trace was made for scenario digest '{}', "
                    "but {} has digest {}",
                    t.meta_value("scenario_digest"), path, s.digest));
  return s;
}

}  // namespace accumcheck
