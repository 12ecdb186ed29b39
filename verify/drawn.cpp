// The micro-batches a trainer drew (verify/drawn.hpp).
#include "verify/drawn.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <set>

namespace accumcheck {

namespace {

using Ids = std::vector<int64_t>;

std::string ids_text(const Ids& ids, size_t most = 8) {
  std::string o;
  for (size_t i = 0; i < ids.size() && i < most; ++i)
    o.append(fmt::format("{}{}", i ? " " : "", ids[i]));
  if (ids.size() > most) o.append(fmt::format(" ... ({} in all)", ids.size()));
  return o;
}

// The scenario's micro-batches of one epoch, in order (ranks = 1).
std::vector<Ids> planned_micro(const EpochPlan& e) {
  std::vector<Ids> m;
  for (const Window& w : e.windows)
    for (const MicroBatch& mb : w.micro) m.push_back(mb.shards.at(0));
  return m;
}

// Micro-steps ([step] -> [rank] -> sample ids) cut into windows of K, the
// last one partial, as sim/plan.cpp cuts the scenario's.
EpochPlan cut(const std::vector<std::vector<Ids>>& steps, int64_t K) {
  EpochPlan e;
  e.accumulation = K;
  for (size_t at = 0; at < steps.size(); at += size_t(K)) {
    Window w;
    for (size_t k = at; k < steps.size() && k < at + size_t(K); ++k)
      w.micro.push_back(MicroBatch{steps[k]});
    w.partial = int64_t(w.micro.size()) < K;
    e.windows.push_back(std::move(w));
  }
  return e;
}

EpochPlan cut(const std::vector<Ids>& micro, int64_t K) {
  std::vector<std::vector<Ids>> steps;
  for (const Ids& m : micro) steps.push_back({m});
  return cut(steps, K);
}

// R > 1 (DDP): per epoch, rank r's forward_backward sample ids in order are
// its micro-batch shards; micro-step k is every rank's k-th (a rank whose
// shard ran out takes part with an empty one, as the plan has it under
// DDP's Join).  Coverage: the epoch's drawn samples, over all ranks, are
// the plan's as a multiset (each sample once, plus the sampler's padding
// repeats).  Order: the plan's, or the trainer's own, judged on what it
// drew (pinned_order = true: the plan's required).
DrawnPlan drawn_plan_ranks(const Scenario& s, const Plan& planned,
                           const TraceRun& run) {
  DrawnPlan d;
  d.plan = planned;
  const int64_t R = planned.ranks, E = planned.epoch_count();
  // [epoch][rank] -> the rank's micro-batch shards
  std::vector<std::vector<std::vector<Ids>>> drawn;
  int64_t without = 0, fb = 0, last_epoch = -1;
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.kind != EventKind::forward_backward) continue;
    ++fb;
    if (e.sample_ids.empty() || e.rank < 0 || e.rank >= R) {
      ++without;
      continue;
    }
    if (e.epoch >= int64_t(drawn.size()))
      drawn.resize(size_t(e.epoch) + 1,
                   std::vector<std::vector<Ids>>(size_t(R)));
    drawn[size_t(e.epoch)][size_t(e.rank)].push_back(e.sample_ids);
    last_epoch = std::max(last_epoch, e.epoch);
  }
  if (fb == 0 || without > 0) {
    d.message = fb == 0 ? "order and coverage not checked: the trace has no "
                          "forward_backward events"
                        : fmt::format(
                              "order and coverage not checked: {} of {} "
                              "forward_backward events carry no sample ids "
                              "or no rank in 0..{}; judged on the "
                              "scenario's order",
                              without, fb, R - 1);
    return d;
  }
  d.known = true;
  d.skipped.resize(size_t(E));
  d.repeated.resize(size_t(E));
  const bool cut_short = s.batching.max_steps >= 0;
  std::vector<std::string> problems;
  auto problem = [&](std::string p) {
    if (problems.size() < 4) problems.push_back(std::move(p));
  };
  if (int64_t(drawn.size()) > E)
    problem(fmt::format("the trace draws {} epochs, the scenario has {}",
                        drawn.size(), E));
  bool order_same = true;
  Plan p;
  p.accumulation = planned.accumulation;
  p.ranks = R;
  for (int64_t ep = 0; ep < E; ++ep) {
    const EpochPlan planned_epoch = planned.epoch(ep);
    std::vector<std::vector<Ids>> want;  // [step] -> [rank]
    std::multiset<int64_t> want_ids, got_ids;
    for (const Window& w : planned_epoch.windows)
      for (const MicroBatch& mb : w.micro) {
        want.push_back(mb.shards);
        for (const Ids& sh : mb.shards) want_ids.insert(sh.begin(), sh.end());
      }
    if (ep >= int64_t(drawn.size()) || ep > last_epoch) {
      if (!cut_short) problem(fmt::format("epoch {}: never drawn", ep));
      p.epochs.push_back(planned_epoch);
      continue;
    }
    const auto& ranks = drawn[size_t(ep)];
    size_t steps = 0;
    for (const auto& shards : ranks) steps = std::max(steps, shards.size());
    std::vector<std::vector<Ids>> got(steps, std::vector<Ids>(size_t(R)));
    for (int64_t r = 0; r < R; ++r)
      for (size_t k = 0; k < ranks[size_t(r)].size(); ++k) {
        got[k][size_t(r)] = ranks[size_t(r)][k];
        got_ids.insert(got[k][size_t(r)].begin(), got[k][size_t(r)].end());
      }
    // Every sample at least once, and as many repeated draws as the
    // sampler's padding (DistributedSampler pads with the first samples of
    // ITS order, so which samples repeat depends on the trainer's shuffle).
    const bool last_cut = cut_short && ep == last_epoch;
    const std::set<int64_t> want_set(want_ids.begin(), want_ids.end()),
        got_set(got_ids.begin(), got_ids.end());
    const size_t pad_want = want_ids.size() - want_set.size(),
                 pad_got = got_ids.size() - got_set.size();
    if (!last_cut) {
      Ids missing;
      std::set_difference(want_set.begin(), want_set.end(), got_set.begin(),
                          got_set.end(), std::back_inserter(missing));
      d.skipped[size_t(ep)] = missing;
      if (!missing.empty())
        problem(fmt::format("epoch {}: {} never drawn on any rank", ep,
                            (missing.size() == 1 ? "sample " : "samples ") +
                                ids_text(missing)));
      if (pad_got != pad_want) {
        Ids again;
        for (int64_t id : got_set)
          if (got_ids.count(id) > 1) again.push_back(id);
        d.repeated[size_t(ep)] = again;
        problem(fmt::format(
            "epoch {}: {} repeated draw{} ({} {}); the sampler's padding "
            "repeats {}",
            ep, pad_got, pad_got == 1 ? "" : "s",
            again.size() == 1 ? "sample" : "samples", ids_text(again),
            pad_want));
      }
    }
    for (int64_t id : got_ids)
      if (id < 0 || id >= s.data.samples) {
        problem(
            fmt::format("epoch {}: sample id {} is not in the data set "
                        "(0..{})",
                        ep, id, s.data.samples - 1));
        break;
      }
    if (got != want) {
      order_same = false;
      if (s.data.pinned_order && got_set == want_set && pad_got == pad_want) {
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
        size_t r = 0;
        while (k < got.size() && k < want.size() && r + 1 < got[k].size() &&
               got[k][r] == want[k][r])
          ++r;
        problem(fmt::format(
            "epoch {}: the order differs from the one the scenario pins "
            "(pinned_order = true): micro-step {} on rank {} holds samples "
            "{}, the scenario's holds {}",
            ep, k, r, k < got.size() ? ids_text(got[k][r]) : "none",
            k < want.size() ? ids_text(want[k][r]) : "none"));
      }
    }
    p.epochs.push_back(cut(got, planned_epoch.accumulation));
  }
  d.ok = problems.empty();
  if (!order_same) {
    d.reordered = true;
    d.plan = std::move(p);
  }
  if (d.ok) {
    d.message = fmt::format(
        "order and coverage: every epoch draws every sample once over the "
        "{} ranks (the sampler's padding repeats included); order {}",
        R,
        order_same ? "as the scenario's plan"
                   : "the trainer's own (the scenario does not pin it); "
                     "judged on the micro-batches it drew");
  } else {
    d.message = "order and coverage: ";
    for (size_t i = 0; i < problems.size(); ++i)
      d.message.append(i ? "; " : "").append(problems[i]);
  }
  return d;
}

}  // namespace

DrawnPlan drawn_plan(const Scenario& s, const Plan& planned,
                     const TraceRun& run) {
  DrawnPlan d;
  d.plan = planned;
  if (planned.ranks > 1) return drawn_plan_ranks(s, planned, run);
  const int64_t E = planned.epoch_count();
  std::vector<std::vector<Ids>> drawn;  // [epoch] -> micro-batches
  int64_t without = 0, fb = 0;
  int64_t last_epoch = -1;
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.kind != EventKind::forward_backward) continue;
    ++fb;
    if (e.sample_ids.empty()) {
      ++without;
      continue;
    }
    if (e.epoch >= int64_t(drawn.size())) drawn.resize(size_t(e.epoch) + 1);
    drawn[size_t(e.epoch)].push_back(e.sample_ids);
    last_epoch = std::max(last_epoch, e.epoch);
  }
  if (fb == 0 || without > 0) {
    d.message = fb == 0 ? "order and coverage not checked: the trace has no "
                          "forward_backward events"
                        : fmt::format(
                              "order and coverage not checked: {} of {} "
                              "forward_backward events carry no sample ids "
                              "(trace schema 1, or a recorder that could not "
                              "tell the samples); judged on the scenario's "
                              "order",
                              without, fb);
    return d;
  }
  d.known = true;
  const bool cut_short = s.batching.max_steps >= 0;
  std::vector<std::string> problems;
  auto problem = [&](std::string p) {
    if (problems.size() < 4) problems.push_back(std::move(p));
  };
  if (int64_t(drawn.size()) > E)
    problem(fmt::format("the trace draws {} epochs, the scenario has {}",
                        drawn.size(), E));
  bool all_short_last = true;
  bool order_same = true;
  Plan p;
  p.accumulation = planned.accumulation;
  p.ranks = planned.ranks;
  d.skipped.resize(size_t(E));
  d.repeated.resize(size_t(E));
  for (int64_t ep = 0; ep < E; ++ep) {
    const EpochPlan planned_epoch = planned.epoch(ep);
    const std::vector<Ids> want = planned_micro(planned_epoch);
    if (ep >= int64_t(drawn.size()) || drawn[size_t(ep)].empty()) {
      if (!cut_short || ep <= last_epoch) {
        problem(fmt::format("epoch {}: never drawn", ep));
        all_short_last = false;
      }
      p.epochs.push_back(planned_epoch);
      continue;
    }
    std::set<int64_t> seen;
    std::vector<Ids> micro;
    for (size_t k = 0; k < drawn[size_t(ep)].size(); ++k) {
      const Ids& ids = drawn[size_t(ep)][k];
      Ids again;
      for (int64_t id : ids)
        if (!seen.insert(id).second) again.push_back(id);
      if (!again.empty()) {
        d.repeated[size_t(ep)].insert(d.repeated[size_t(ep)].end(),
                                      again.begin(), again.end());
        problem(fmt::format(
            "epoch {}: micro-batch {} (samples {}) repeats {} already drawn "
            "in the epoch",
            ep, k, ids_text(ids),
            again.size() == ids.size() ? std::string("samples")
                                       : "samples " + ids_text(again)));
      }
      if (again.size() != ids.size()) micro.push_back(ids);
    }
    // Samples of the epoch never drawn, in the scenario's order.
    Ids missing;
    for (const Ids& m : want)
      for (int64_t id : m)
        if (!seen.count(id)) missing.push_back(id);
    for (int64_t id : seen)
      if (id < 0 || id >= s.data.samples)
        problem(
            fmt::format("epoch {}: sample id {} is not in the data set "
                        "(0..{})",
                        ep, id, s.data.samples - 1));
    const bool last_cut = cut_short && ep == last_epoch;
    if (!missing.empty() && !last_cut) {
      d.skipped[size_t(ep)] = missing;
      const Ids& last = want.back();
      const bool short_last =
          int64_t(last.size()) < s.batching.micro_batch && missing == last;
      all_short_last = all_short_last && short_last;
      problem(fmt::format("epoch {}: {} never drawn{}", ep,
                          missing.size() == 1 ? "sample " + ids_text(missing)
                                              : "samples " + ids_text(missing),
                          short_last ? " (the epoch's short last micro-batch: "
                                       "a DataLoader with drop_last=True?)"
                                     : ""));
      for (size_t at = 0; at < missing.size();
           at += size_t(s.batching.micro_batch))
        micro.push_back(
            Ids(missing.begin() + std::ptrdiff_t(at),
                missing.begin() +
                    std::ptrdiff_t(std::min(
                        missing.size(), at + size_t(s.batching.micro_batch)))));
    }
    if (micro != want) {
      order_same = false;
      if (s.data.pinned_order && d.repeated[size_t(ep)].empty() &&
          missing.empty()) {
        size_t k = 0;
        while (k < micro.size() && k < want.size() && micro[k] == want[k]) ++k;
        problem(fmt::format(
            "epoch {}: the order differs from the one the scenario pins "
            "(pinned_order = true): micro-batch {} holds samples {}, the "
            "scenario's holds {}",
            ep, k, k < micro.size() ? ids_text(micro[k]) : "none",
            k < want.size() ? ids_text(want[k]) : "none"));
      }
    }
    p.epochs.push_back(cut(micro, planned_epoch.accumulation));
  }
  bool any_skip = false;
  for (const Ids& sk : d.skipped) any_skip = any_skip || !sk.empty();
  d.skips_are_short_last = any_skip && all_short_last;
  d.ok = problems.empty();
  if (!order_same) {
    d.reordered = true;
    d.plan = std::move(p);
  }
  if (d.ok) {
    d.message = fmt::format(
        "order and coverage: every epoch draws every sample once; order {}",
        order_same ? "as the scenario's plan"
                   : "the trainer's own (the scenario does not pin it); "
                     "judged on the micro-batches it drew");
  } else {
    d.message = "order and coverage: ";
    for (size_t i = 0; i < problems.size(); ++i)
      d.message.append(i ? "; " : "").append(problems[i]);
  }
  return d;
}

}  // namespace accumcheck
