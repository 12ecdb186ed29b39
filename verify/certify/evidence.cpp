// Model-free evidence (verify/certify/evidence.hpp).
#include "verify/certify/evidence.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "sim/trainer.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck {

namespace {

// Solves A w = b (n x n, row-major) by Gaussian elimination with partial
// pivoting; false when A is singular to working precision.
bool solve(std::vector<double> A, std::vector<double> b, size_t n,
           std::vector<double>& w) {
  double scale = 0;
  for (double a : A) scale = std::max(scale, std::fabs(a));
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(A[r * n + c]) > std::fabs(A[p * n + c])) p = r;
    if (std::fabs(A[p * n + c]) <= 1e-12 * scale) return false;
    if (p != c) {
      for (size_t k = 0; k < n; ++k) std::swap(A[c * n + k], A[p * n + k]);
      std::swap(b[c], b[p]);
    }
    for (size_t r = c + 1; r < n; ++r) {
      const double f = A[r * n + c] / A[c * n + c];
      for (size_t k = c; k < n; ++k) A[r * n + k] -= f * A[c * n + k];
      b[r] -= f * b[c];
    }
  }
  w.assign(n, 0);
  for (size_t c = n; c-- > 0;) {
    double v = b[c];
    for (size_t k = c + 1; k < n; ++k) v -= A[c * n + k] * w[k];
    w[c] = v / A[c * n + c];
  }
  return true;
}

// The global window each optimizer step of `b` closes, and its epoch.
std::vector<StepRecord<double>> step_windows(const EvidenceInput& in) {
  NullEngine null;
  TrainerOptions opt;
  opt.record_values = false;
  opt.record_events = false;
  opt.max_steps = in.s.batching.max_steps;
  Trainer<NullEngine> t(null, in.s, in.accepted, in.s.optimizer.lr, opt);
  return t.run(in.plan, "evidence").steps;
}

// Window `index` (global, from 0) of a plan, built or lazy.
std::optional<Window> window_at(const Plan& plan, int64_t index) {
  std::optional<Window> found;
  int64_t before = 0;
  plan.visit([&](int64_t, const EpochPlan& e) {
    const int64_t n = int64_t(e.windows.size());
    if (index >= before && index < before + n)
      found = e.windows[size_t(index - before)];
    before += n;
    return !found;
  });
  return found;
}

// The accepted weight of micro-batch k of window w (per unit of summed
// item loss): the accepted semantics' normalization.
double accepted_weight(const EvidenceInput& in, const Window& w, size_t k,
                       int64_t Nw, int64_t bk) {
  const int64_t K = in.plan.accumulation;
  const int64_t Kw = int64_t(w.micro.size());
  if (w.partial && in.accepted.partial_scale_by_k) return 1.0 / double(K * bk);
  switch (in.accepted.normalization) {
    case Normalization::window_items:
      return 1.0 / double(Nw);
    case Normalization::micro_mean:
      return 1.0 / double(bk);
    case Normalization::micro_mean_over_window_micros:
      return 1.0 / double(Kw * bk);
    case Normalization::micro_mean_over_k:
      return 1.0 / double(K * bk);
    case Normalization::micro_sum_over_k:
      return 1.0 / double(K);
    case Normalization::rank_window_items:
      // The rank's own window items: with one rank, the window's.
      return 1.0 / double(Nw);
  }
  (void)k;
  return 1.0 / double(Nw);
}

std::string weight_text(double w, int64_t Nw, int64_t K, int64_t bk,
                        double rel) {
  auto near = [&](double a, double b) {
    return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
  };
  const double f = w * double(Nw);
  const double r = std::round(f);
  if (std::fabs(f) <= rel) return "weighs 0: skipped";
  if (r >= 1 && near(f, r)) {
    if (r == 1) return "weighs 1/N_w";
    if (r == 2) return "weighs 2/N_w: counted twice";
    return fmt::format("weighs {}/N_w: counted {} times", int64_t(r),
                       int64_t(r));
  }
  if (near(w, 1.0 / double(K * bk)))
    return fmt::format("weighs 1/(K*b_k) = 1/{}", K * bk);
  if (near(w, 1.0 / double(bk)))
    return fmt::format("weighs 1/b_k = 1/{} (not divided by K)", bk);
  return fmt::format("weighs {:.4g}/N_w", f);
}

}  // namespace

WindowFit fit_window(const EvidenceInput& in, int64_t step, int64_t window) {
  WindowFit fit;
  fit.step = step;
  if (step < 0 || size_t(step) >= in.trace.size()) return fit;
  const std::vector<StepRecord<double>> steps = step_windows(in);
  if (window < 0 && size_t(step) >= steps.size()) return fit;
  const std::optional<Window> found =
      window_at(in.plan, window >= 0 ? window : steps[size_t(step)].window);
  if (!found) return fit;
  const Window& w = *found;

  Oracle<double> o(in.s.model, in.data, in.init);
  std::vector<double> theta;
  if (step == 0)
    theta.assign(in.init.begin(), in.init.end());
  else
    theta = in.trace[size_t(step) - 1].param.vector();
  o.set_epoch(size_t(step) < steps.size() ? steps[size_t(step)].epoch
                                          : steps.back().epoch);
  std::vector<std::vector<double>> g;
  for (const MicroBatch& m : w.micro) {
    o.params() = theta;
    o.zero_grad();
    std::vector<int64_t> ids;
    for (const auto& shard : m.shards)
      ids.insert(ids.end(), shard.begin(), shard.end());
    o.forward_backward(ids, 1);
    g.push_back(o.grads());
    const int64_t items = o.items(ids);
    fit.micro_items.push_back(items);
    fit.items += items;
  }
  std::vector<double> G = in.trace[size_t(step)].grad.vector();
  // Undo the step's clip (the last clip event before the step, with its
  // pre-clip norm), so the weights are those of the summed losses.
  if (in.s.clip.enabled) {
    double norm = kNaN;
    for (const TraceEvent& te : in.run.events)
      if (te.event.step == step && te.event.kind == EventKind::clip)
        norm = te.event.grad_norm;
    if (!std::isnan(norm)) {
      const double coef = in.s.clip.max_norm / (norm + 1e-6);
      if (coef < 1) {
        fit.clip_coef = coef;
        for (double& v : G) v /= coef;
      }
    }
  }
  // The accepted L2-in-loss term: lambda * theta over the window.
  if (in.s.optimizer.l2_in_loss != 0.0 && !in.accepted.l2_unnormalized)
    for (size_t i = 0; i < G.size(); ++i)
      G[i] -= in.s.optimizer.l2_in_loss * theta[i];
  const size_t n = g.size();
  std::vector<double> A(n * n), b(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double d = 0;
      for (size_t p = 0; p < G.size(); ++p) d += g[i][p] * g[j][p];
      A[i * n + j] = d;
    }
    double d = 0;
    for (size_t p = 0; p < G.size(); ++p) d += g[i][p] * G[p];
    b[i] = d;
  }
  if (!solve(A, b, n, fit.weight)) return fit;
  double res = 0, norm = 0;
  for (size_t p = 0; p < G.size(); ++p) {
    double v = G[p];
    for (size_t k = 0; k < n; ++k) v -= fit.weight[k] * g[k][p];
    res += v * v;
    norm += G[p] * G[p];
  }
  fit.residual = norm > 0 ? std::sqrt(res / norm) : 0;
  fit.fitted = true;
  return fit;
}

std::vector<std::string> unexplained_evidence(const EvidenceInput& in) {
  std::vector<std::string> lines;
  // Windows of another size than the scenario's K first: what follows
  // (weights, step count) is read against the declared K.
  const std::string windows = windows_evidence(
      trace_windows(in.run, in.plan, in.trace_steps), "the scenario declares");
  if (!windows.empty()) lines.push_back(windows);
  const double rel = error_model::tolerance("evidence_weight_rel");
  const double max_residual = error_model::tolerance("evidence_fit_residual");
  const int64_t t = in.first_out;
  if (t >= 0) {
    const WindowFit fit = fit_window(in, t);
    std::string first = fmt::format("first out of the bound: step {}, {}", t,
                                    in.first_out_what);
    if (fit.fitted && fit.residual <= max_residual) {
      const std::vector<StepRecord<double>> steps = step_windows(in);
      const Window w = *window_at(in.plan, steps[size_t(t)].window);
      std::string weights;
      int64_t first_k = -1;
      bool all_k_b = true;
      // A micro-batch that weighs 0 in step t: the later steps of the
      // trace (as many as the window has micro-batches) fitted over the
      // same window say where it was stepped instead (alone: a window of
      // one micro-batch); "skipped" only when none holds it.
      const auto elsewhere = [&](size_t k) -> std::string {
        const int64_t n = int64_t(fit.weight.size());
        for (int64_t s = t + 1; s <= t + n && size_t(s) < in.trace.size();
             ++s) {
          const WindowFit o = fit_window(in, s, steps[size_t(t)].window);
          if (!o.fitted || o.residual > max_residual ||
              std::fabs(o.weight[k]) * double(o.items) <= rel)
            continue;
          std::vector<size_t> with;
          for (size_t i = 0; i < o.weight.size(); ++i)
            if (i != k && std::fabs(o.weight[i]) * double(o.items) > rel)
              with.push_back(i);
          std::string others;
          for (size_t i : with)
            others += fmt::format("{}{}", others.empty() ? "" : ", ", i);
          return fmt::format(
              "is not in step {}: stepped at step {} {}, weighing {:.4g}/N_w "
              "there",
              t, s,
              with.empty() ? std::string("alone")
                           : fmt::format("with micro-batch{} {}",
                                         with.size() > 1 ? "es" : "", others),
              o.weight[k] * double(o.items));
        }
        return "weighs 0: in no optimizer step (skipped)";
      };
      for (size_t k = 0; k < fit.weight.size(); ++k) {
        const int64_t bk = fit.micro_items[k];
        const double want = accepted_weight(in, w, k, fit.items, bk);
        if (first_k < 0 && std::fabs(fit.weight[k] - want) > rel * want)
          first_k = int64_t(k);
        all_k_b = all_k_b &&
                  std::fabs(fit.weight[k] * double(in.plan.accumulation * bk) -
                            1) <= rel;
        weights.append(
            fmt::format("{}micro-batch {} {}", k ? "; " : "", k,
                        std::fabs(fit.weight[k] * double(fit.items)) <= rel
                            ? elsewhere(k)
                            : weight_text(fit.weight[k], fit.items,
                                          in.plan.accumulation, bk, rel)));
      }
      if (first_k >= 0)
        first.append(
            fmt::format(", micro-batch {} of its window (the first "
                        "whose weight is not {}'s)",
                        first_k, in.accepted_name));
      lines.push_back(first);
      lines.push_back(fmt::format(
          "micro-batch weights in the window of step {} ({} micro-batches, "
          "N_w = {}{}), fitted from the trace: {}{}",
          t, fit.weight.size(), fit.items,
          fit.clip_coef < 1
              ? fmt::format("; its clip's factor {:.6g} undone", fit.clip_coef)
              : std::string(),
          weights,
          all_k_b && first_k >= 0 && fit.weight.size() > 1
              ? " (weights 1/(K*b_k))"
              : ""));
    } else {
      lines.push_back(first);
      lines.push_back(
          fit.fitted
              ? fmt::format(
                    "micro-batch weights: the gradient of step {} is no "
                    "weighted sum of its window's micro-batch gradients "
                    "(relative residual {:.3g}): it holds other gradients "
                    "(another window's, a stale sum) or was changed after "
                    "backward",
                    t, fit.residual)
              : fmt::format("micro-batch weights: not fitted for step {} (its "
                            "micro-batches' gradients are not independent)",
                            t));
    }
  }
  if (in.lr.checked)
    lines.push_back(in.lr.ok ? std::string("lr: as the accepted schedule at "
                                           "every step (lr ratio 1)")
                             : in.lr.message + "; " + in.lr.evidence);
  else
    lines.push_back(in.lr.message);
  lines.push_back(
      in.trace_steps == in.expected_steps
          ? fmt::format("step count: {} optimizer steps, as {}", in.trace_steps,
                        in.accepted_name)
          : fmt::format("step count: the trace has {} optimizer steps, {} "
                        "takes {} ({:+})",
                        in.trace_steps, in.accepted_name, in.expected_steps,
                        in.trace_steps - in.expected_steps));
  return lines;
}

int64_t windows_k(const std::vector<RunWindow>& windows) {
  // Each epoch's windows, in order (a step's epoch never decreases).
  std::set<int64_t> sizes;  // the epochs' K' (those that say one)
  bool declared_differs = false;
  for (size_t a = 0; a < windows.size();) {
    size_t b = a;
    while (b < windows.size() && windows[b].epoch == windows[a].epoch) ++b;
    if (b - a >= 2) {
      const int64_t k = windows[a].backward;
      for (size_t i = a; i < b; ++i) {
        const int64_t n = windows[i].backward;
        // Every window but the last holds k, the last 1..k.
        if (i + 1 < b ? n != k : (n < 1 || n > k)) return 0;
      }
      if (k < 1) return 0;
      sizes.insert(k);
      declared_differs = declared_differs || windows[a].declared != k;
    }
    a = b;
  }
  if (sizes.size() != 1 || !declared_differs) return 0;
  return *sizes.begin();
}

std::string windows_evidence(const std::vector<RunWindow>& windows,
                             const std::string& declared_by) {
  const int64_t k = windows_k(windows);
  if (k == 0) return "";
  std::set<int64_t> declared;
  std::vector<int64_t> per_epoch;
  for (size_t i = 0; i < windows.size(); ++i) {
    declared.insert(windows[i].declared);
    if (i == 0 || windows[i].epoch != windows[i - 1].epoch)
      per_epoch.push_back(windows[i].declared);
  }
  const std::string said =
      declared.size() == 1
          ? fmt::format("K = {}", *declared.begin())
          : fmt::format("K per epoch {}", fmt::join(per_epoch, ", "));
  return fmt::format(
      "windows: each of the {} optimizer steps closes a window of {} "
      "micro-batches (each epoch's last at most {}), and {} {}: the run "
      "looks like K = {}",
      windows.size(), k, k, declared_by, said, k);
}

std::vector<RunWindow> trace_windows(const TraceRun& run, const Plan& plan,
                                     int64_t steps) {
  // The plan's K of each epoch the steps reach (each built once).
  std::map<int64_t, int64_t> k_of_epoch;
  auto k_of = [&](int64_t epoch) {
    if (epoch < 0 || epoch >= plan.epoch_count()) return plan.accumulation;
    auto it = k_of_epoch.find(epoch);
    if (it == k_of_epoch.end())
      it = k_of_epoch.emplace(epoch, plan.epoch(epoch).accumulation).first;
    return it->second;
  };
  // A micro-batch backwarded twice (its sample ids again) is one of the
  // window's micro-batches; a backward with no ids recorded is one each.
  std::vector<RunWindow> out;
  std::set<std::vector<int64_t>> micro;
  int64_t unnamed = 0;
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.rank != 0) continue;
    if (e.kind == EventKind::forward_backward) {
      if (e.sample_ids.empty())
        ++unnamed;
      else
        micro.insert(e.sample_ids);
    }
    if (e.kind != EventKind::optimizer_step) continue;
    if (int64_t(out.size()) >= steps) break;
    out.push_back({e.epoch, int64_t(micro.size()) + unnamed, k_of(e.epoch)});
    micro.clear();
    unnamed = 0;
  }
  return out;
}

}  // namespace accumcheck
