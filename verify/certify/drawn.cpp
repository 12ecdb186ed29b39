// The micro-batches a trainer drew (verify/certify/drawn.hpp).
#include "verify/certify/drawn.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <string_view>

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

// What the check finds, the first four problems kept for its message.
struct Findings {
  std::vector<std::string> problems;
  void add(std::string p) {
    if (problems.size() < 4) problems.push_back(std::move(p));
  }
};

// The check's start, shared by one rank and many: the epochs drawn against
// the scenario's, the per-epoch lists sized.
Findings begin_check(DrawnPlan& d, size_t drawn_epochs, int64_t E) {
  d.known = true;
  d.skipped.resize(size_t(E));
  d.repeated.resize(size_t(E));
  Findings f;
  if (int64_t(drawn_epochs) > E)
    f.add(fmt::format("the trace draws {} epochs, the scenario has {}",
                      drawn_epochs, E));
  return f;
}

// The check's end: its verdict, the plan certify judges on (the drawn one
// when the order differs) and its message; `covered` says what passed.
void conclude(DrawnPlan& d, const Findings& f, bool order_same, Plan&& drawn,
              std::string_view covered) {
  d.ok = f.problems.empty();
  if (!order_same) {
    d.reordered = true;
    d.plan = std::move(drawn);
  }
  if (d.ok) {
    d.message = fmt::format(
        "order and coverage: {}; order {}", covered,
        order_same ? "as the scenario's plan"
                   : "the trainer's own (the scenario does not pin it); "
                     "judged on the micro-batches it drew");
  } else {
    d.message = "order and coverage: ";
    for (size_t i = 0; i < f.problems.size(); ++i)
      d.message.append(i ? "; " : "").append(f.problems[i]);
  }
}

// The forward_backward events' sample ids, [epoch][rank] -> shards in
// order; `unchecked` says why the check cannot run (no events, or events
// without sample ids or a rank in 0..R-1), empty when it can.
struct Gathered {
  std::vector<std::vector<std::vector<Ids>>> by_epoch;
  int64_t last_epoch = -1;
  std::string unchecked;
};

Gathered gather(const TraceRun& run, int64_t R) {
  Gathered g;
  int64_t without = 0, fb = 0;
  for (const TraceEvent& te : run.events) {
    const Event& e = te.event;
    if (e.kind != EventKind::forward_backward) continue;
    ++fb;
    const int64_t r = R > 1 ? e.rank : 0;
    if (e.sample_ids.empty() || r < 0 || r >= R) {
      ++without;
      continue;
    }
    if (e.epoch >= int64_t(g.by_epoch.size()))
      g.by_epoch.resize(size_t(e.epoch) + 1,
                        std::vector<std::vector<Ids>>(size_t(R)));
    g.by_epoch[size_t(e.epoch)][size_t(r)].push_back(e.sample_ids);
    g.last_epoch = std::max(g.last_epoch, e.epoch);
  }
  if (fb == 0)
    g.unchecked =
        "order and coverage not checked: the trace has no forward_backward "
        "events";
  else if (without > 0)
    g.unchecked = fmt::format(
        "order and coverage not checked: {} of {} forward_backward events "
        "carry no sample ids (trace schema 1, or a recorder that could not "
        "tell the samples){}; judged on the scenario's order",
        without, fb, R > 1 ? fmt::format(" or no rank in 0..{}", R - 1) : "");
  return g;
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
  const Gathered g = gather(run, R);
  if (!g.unchecked.empty()) {
    d.message = g.unchecked;
    return d;
  }
  const auto& drawn = g.by_epoch;  // [epoch][rank] -> the rank's shards
  const int64_t last_epoch = g.last_epoch;
  Findings found = begin_check(d, drawn.size(), E);
  auto problem = [&](std::string p) { found.add(std::move(p)); };
  const bool cut_short = s.batching.max_steps >= 0;
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
  conclude(d, found, order_same, std::move(p),
           fmt::format("every epoch draws every sample once over the {} "
                       "ranks (the sampler's padding repeats included)",
                       R));
  return d;
}

}  // namespace

DrawnPlan drawn_plan(const Scenario& s, const Plan& planned,
                     const TraceRun& run) {
  DrawnPlan d;
  d.plan = planned;
  if (planned.ranks > 1) return drawn_plan_ranks(s, planned, run);
  const int64_t E = planned.epoch_count();
  const Gathered g = gather(run, 1);
  if (!g.unchecked.empty()) {
    d.message = g.unchecked;
    return d;
  }
  std::vector<std::vector<Ids>> drawn;  // [epoch] -> micro-batches
  for (const auto& ranks : g.by_epoch) drawn.push_back(ranks[0]);
  const int64_t last_epoch = g.last_epoch;
  Findings found = begin_check(d, drawn.size(), E);
  auto problem = [&](std::string p) { found.add(std::move(p)); };
  const bool cut_short = s.batching.max_steps >= 0;
  bool all_short_last = true;
  bool order_same = true;
  Plan p;
  p.accumulation = planned.accumulation;
  p.ranks = planned.ranks;
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
  conclude(d, found, order_same, std::move(p),
           "every epoch draws every sample once");
  return d;
}

}  // namespace accumcheck
