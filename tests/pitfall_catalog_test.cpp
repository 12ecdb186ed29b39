// The pitfall catalog by NAME, the way users and scenario files spell it:
//  - each id maps to the Behavior fields DESIGN.md section 5 describes (so
//    two ids swapped in sim/pitfalls.cpp fail here, not only in the
//    PyTorch tests);
//  - each pitfall's own scenario (scenarios/<id>.toml), parsed and run
//    through the one Trainer on the NullEngine, gives per window the call
//    signature that id stands for, written here from the id alone;
//  - the correct window gradient of a token model equals a sum computed
//    here, outside the Trainer and the engines, over loss-bearing tokens
//    only, divided by the window's token count N_w (counting padding in
//    N_w fails it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "hole_test_util.hpp"
#include "oracle/error_model.hpp"
#include "oracle/oracle.hpp"
#include "sim/data.hpp"
#include "sim/layout.hpp"
#include "sim/pitfalls.hpp"
#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "sim/trainer.hpp"
#include "tests/source_dir.hpp"
#include "verify/export/null_engine.hpp"

namespace accumcheck {
namespace {

const std::string kScenarios =
    ::accumcheck::testing_util::source_dir() + "/scenarios/";

// ------------------------------------------------ name -> Behavior table

struct Expected {
  const char* id;
  Behavior b;
};

Behavior with(auto&& edit) {
  Behavior b;
  edit(b);
  return b;
}

// Written from DESIGN.md section 5, field by field.
const Expected kTable[] = {
    {"no-loss-normalization",
     with([](Behavior& b) { b.normalization = Normalization::micro_mean; })},
    {"sample-mean-of-means", with([](Behavior& b) {
       b.normalization = Normalization::micro_mean_over_window_micros;
     })},
    {"token-mean-of-means", with([](Behavior& b) {
       b.normalization = Normalization::micro_mean_over_window_micros;
     })},
    {"zero-grad-every-micro-step",
     with([](Behavior& b) { b.zero_grad = ZeroGradTiming::every_micro_step; })},
    {"seed-002-loop", with([](Behavior& b) {
       b.seed_002_loop = true;
       b.normalization = Normalization::micro_mean_over_k;
     })},
    {"zero-grad-never",
     with([](Behavior& b) { b.zero_grad = ZeroGradTiming::never; })},
    {"step-every-micro-step",
     with([](Behavior& b) { b.step_every_micro_step = true; })},
    {"partial-cycle-scale-by-k",
     with([](Behavior& b) { b.partial_scale_by_k = true; })},
    {"partial-cycle-drop",
     with([](Behavior& b) { b.partial = PartialWindow::drop; })},
    {"partial-cycle-leak", with([](Behavior& b) {
       b.partial = PartialWindow::leak;
       b.partial_scale_by_k = true;
     })},
    {"scheduler-per-micro-step",
     with([](Behavior& b) { b.scheduler_per_micro_step = true; })},
    {"schedule-horizon-in-micro-steps",
     with([](Behavior& b) { b.schedule_horizon_in_micro_steps = true; })},
    {"clip-per-micro-step",
     with([](Behavior& b) { b.clip_per_micro_step = true; })},
    {"l2-in-loss-unnormalized",
     with([](Behavior& b) { b.l2_unnormalized = true; })},
    {"ramp-normalization-stale",
     with([](Behavior& b) { b.normalization_stale_k = true; })},
    {"ramp-schedule-horizon-fixed",
     with([](Behavior& b) { b.horizon_initial_k = true; })},
    {"window-boundary-off-by-one", with([](Behavior& b) {
       b.window_off_by_one = true;
       b.normalization = Normalization::micro_mean_over_k;
       b.partial = PartialWindow::leak;
     })},
    {"scheduler-before-optimizer",
     with([](Behavior& b) { b.scheduler_before_optimizer = true; })},
    {"scheduler-per-epoch",
     with([](Behavior& b) { b.scheduler_per_epoch = true; })},
    {"skip-short-micro-batch",
     with([](Behavior& b) { b.skip_short_micro_batch = true; })},
    {"token-count-unshifted-labels",
     with([](Behavior& b) { b.count_unshifted_labels = true; })},
    // The ddp-* rows' call patterns (per rank) are pinned in
    // tests/trainer_events_test.cpp (TwoRanks); the per-window signatures
    // of every row above are checked here.
    {"ddp-token-mean-across-ranks", with([](Behavior& b) {
       b.normalization = Normalization::rank_window_items;
     })},
    {"ddp-uneven-shards", with([](Behavior& b) {
       b.normalization = Normalization::rank_window_items;
     })},
    {"ddp-no-sync-everywhere", with([](Behavior& b) { b.sync = Sync::never; })},
    {"ddp-sync-every-micro-step",
     with([](Behavior& b) { b.sync = Sync::every_micro_step; })},
    {"ddp-clip-local-norm",
     with([](Behavior& b) { b.clip_local_norm = true; })},
    {"ddp-scheduler-per-rank",
     with([](Behavior& b) { b.scheduler_per_rank = true; })},
    {"low-precision-grad-buffer",
     with([](Behavior& b) { b.low_precision_grad_buffer = true; })},
    {"clip-before-unscale",
     with([](Behavior& b) { b.clip_before_unscale = true; })},
    {"scaler-update-every-micro-step",
     with([](Behavior& b) { b.scaler_update_every_micro_step = true; })},
    {"skipped-step-advances-scheduler",
     with([](Behavior& b) { b.skipped_step_advances_scheduler = true; })},
    {"accumulator-rescaled",
     with([](Behavior& b) { b.accumulator_rescaled = true; })},
    {"ema-every-micro-step",
     with([](Behavior& b) { b.ema_every_micro_step = true; })},
    {"optimizer-state-every-micro-step",
     with([](Behavior& b) { b.optimizer_state_every_micro_step = true; })},
    {"window-boundary-off-by-one-max-steps", with([](Behavior& b) {
       b.window_off_by_one = true;
       b.normalization = Normalization::micro_mean_over_k;
       b.stop_at_planned_steps = true;
     })},
    {"window-counter-across-epochs", with([](Behavior& b) {
       b.windows_across_epochs = true;
       b.partial = PartialWindow::leak;
     })},
    {"step-budget-drops-micro-batches",
     with([](Behavior& b) { b.stop_at_floor_budget = true; })},
    {"loss-divided-by-k-twice",
     with([](Behavior& b) { b.loss_divided_by_k_again = true; })},
    {"end-of-loader-syncs-every-micro-batch",
     with([](Behavior& b) { b.end_of_loader_steps_every_micro_step = true; })},
    {"items-counted-per-fetch-group",
     with([](Behavior& b) { b.items_per_fetch_group = true; })},
    {"last-fetch-sized-in-samples",
     with([](Behavior& b) { b.last_fetch_in_samples = true; })},
    {"ddp-clip-before-all-reduce",
     with([](Behavior& b) { b.clip_before_all_reduce = true; })},
    {"lr-scaled-by-k", with([](Behavior& b) { b.lr_times_k = true; })},
    {"scheduler-frequency-in-micro-batches",
     with([](Behavior& b) { b.frequency_in_micro_batches = true; })},
    {"window-buffer-across-epochs",
     with([](Behavior& b) { b.buffer_across_epochs = true; })},
    {"window-sum-across-epochs",
     with([](Behavior& b) { b.sum_across_epochs = true; })},
    {"summed-loss-divided-by-k", with([](Behavior& b) {
       b.normalization = Normalization::micro_sum_over_k;
     })},
};

TEST(PitfallCatalog, EveryIdMapsToItsBehavior) {
  ASSERT_EQ(std::size(kTable), std::size(kAllPitfalls))
      << "a pitfall was added or removed: give it a row here";
  for (const Expected& e : kTable) {
    const std::optional<Pitfall> p = pitfall_from_id(e.id);
    ASSERT_TRUE(p) << e.id << " is not in the catalog";
    EXPECT_EQ(pitfall_id(*p), e.id);
    EXPECT_TRUE(behavior_of({*p}) == e.b)
        << e.id << " does not switch the fields DESIGN.md describes";
    EXPECT_EQ(semantics_name({*p}), e.id);
  }
  EXPECT_TRUE(behavior_of({}) == Behavior{}) << "correct is the default";
  EXPECT_FALSE(pitfall_from_id("correct"));
}

// Every behaviour but the two mean-of-means names (one switch, named for
// the loss) is distinct, so no id can stand in for another.
TEST(PitfallCatalog, BehaviorsAreDistinct) {
  for (const Expected& a : kTable)
    for (const Expected& b : kTable) {
      if (&a == &b) continue;
      // Likewise the two DDP rank means (tokens, samples).
      auto rank_mean = [](std::string_view id) {
        return id == "ddp-token-mean-across-ranks" || id == "ddp-uneven-shards";
      };
      const bool same_switch =
          (std::string_view(a.id).ends_with("-mean-of-means") &&
           std::string_view(b.id).ends_with("-mean-of-means")) ||
          (rank_mean(a.id) && rank_mean(b.id));
      EXPECT_EQ(a.b == b.b, same_switch) << a.id << " vs " << b.id;
    }
}

// Performance-only (the values unchanged, only the work): exactly the
// pitfall whose Behavior changes only when DDP all-reduces, and that
// switch keeps every value the same (the properties' ddp.sync-every-
// micro-step checks the values; this pins which entries carry the mark).
TEST(PitfallCatalog, PerformanceOnlyEntries) {
  std::vector<std::string_view> marked;
  for (Pitfall p : kAllPitfalls)
    if (pitfall_performance_only(p)) marked.push_back(pitfall_id(p));
  EXPECT_EQ(marked, std::vector<std::string_view>{"ddp-sync-every-micro-step"});
  Behavior only_sync;
  only_sync.sync = Sync::every_micro_step;
  EXPECT_EQ(behavior_of({Pitfall::ddp_sync_every_micro_step}), only_sync);
}

// The candidates certify and the contract tier judge: correct, each
// in-scope pitfall alone and every pair.  Of each one-switch pair of names
// only the loss's own is a candidate; the GradScaler pitfalls only with
// loss scaling, the EMA one only with an EMA; the contract tier leaves out
// the three its coefficient engine cannot see.
TEST(PitfallCatalog, CandidateScope) {
  auto singles = [](CandidateScope scope) {
    std::vector<std::string> ids;
    for (const auto& sem : candidate_semantics(scope))
      if (sem.size() == 1) ids.emplace_back(pitfall_id(sem[0]));
    return ids;
  };
  auto has = [](const std::vector<std::string>& ids, std::string_view id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  const auto sample = singles({});
  const auto token = singles({.token_loss = true});
  const auto scaled = singles({.loss_scaling = true, .ema = true});
  const auto contract = singles({.contract_tier = true});
  for (std::string_view id : {"sample-mean-of-means", "ddp-uneven-shards"}) {
    EXPECT_TRUE(has(sample, id)) << id;
    EXPECT_FALSE(has(token, id)) << id;
  }
  for (std::string_view id :
       {"token-mean-of-means", "ddp-token-mean-across-ranks",
        "token-count-unshifted-labels"}) {
    EXPECT_TRUE(has(token, id)) << id;
    EXPECT_FALSE(has(sample, id)) << id;
  }
  for (std::string_view id :
       {"clip-before-unscale", "scaler-update-every-micro-step",
        "skipped-step-advances-scheduler", "ema-every-micro-step"}) {
    EXPECT_FALSE(has(sample, id)) << id;
    EXPECT_TRUE(has(scaled, id)) << id;
  }
  for (std::string_view id :
       {"low-precision-grad-buffer", "optimizer-state-every-micro-step",
        "ddp-clip-local-norm"}) {
    EXPECT_TRUE(has(sample, id)) << id;
    EXPECT_FALSE(has(contract, id)) << id;
  }
  // On a bf16 .grad (the contract tier's step fit within the bf16 bound
  // only) low-precision-grad-buffer is a candidate; the others stay out.
  const auto lowp =
      singles({.contract_tier = true, .contract_lowp_buffer = true});
  EXPECT_TRUE(has(lowp, "low-precision-grad-buffer"));
  EXPECT_FALSE(has(lowp, "optimizer-state-every-micro-step"));
  EXPECT_FALSE(has(lowp, "ddp-clip-local-norm"));
  // On a sharded trace (each rank's shard fitted, its clips' shard norms
  // recorded) ddp-clip-local-norm is a candidate; the others stay out.
  const auto shard =
      singles({.contract_tier = true, .contract_shard_clip = true});
  EXPECT_TRUE(has(shard, "ddp-clip-local-norm"));
  EXPECT_FALSE(has(shard, "optimizer-state-every-micro-step"));
  EXPECT_FALSE(has(shard, "low-precision-grad-buffer"));
  // items-counted-per-fetch-group is no candidate of its own: it is
  // added, right after window-counter-across-epochs, to exactly the
  // candidates that cut their windows across epochs and count items.
  const Pitfall fetch = Pitfall::items_counted_per_fetch_group;
  EXPECT_FALSE(has(sample, "items-counted-per-fetch-group"));
  auto counts_across = [](const std::vector<Pitfall>& sem) {
    const Behavior b = behavior_of(sem);
    return b.windows_across_epochs &&
           (b.normalization == Normalization::window_items ||
            b.normalization == Normalization::rank_window_items);
  };
  auto fetch_copies = [&](CandidateScope scope) {
    const auto sems = candidate_semantics(scope);
    size_t copies = 0, counting = 0;
    for (const auto& sem : sems) {
      const auto at = std::find(sem.begin(), sem.end(), fetch);
      if (at == sem.end()) {
        counting += counts_across(sem) ? 1 : 0;
        continue;
      }
      ++copies;
      EXPECT_TRUE(at != sem.begin() &&
                  *(at - 1) == Pitfall::window_counter_across_epochs)
          << semantics_name(sem);
      std::vector<Pitfall> without = sem;
      without.erase(without.begin() + (at - sem.begin()));
      EXPECT_TRUE(counts_across(without)) << semantics_name(sem);
      EXPECT_NE(std::find(sems.begin(), sems.end(), without), sems.end())
          << semantics_name(sem);
    }
    EXPECT_EQ(copies, counting);
    EXPECT_GT(copies, 0u);
    return copies;
  };
  // correct, n singles, n(n-1)/2 pairs but the 2 that pair
  // window-counter-across-epochs with a window-boundary-off-by-one loop
  // (both cut the windows), the 6 that pair window-buffer-across-epochs
  // with those three (all cut) or a partial-cycle pitfall (no partial
  // window runs beside it), the 7 that pair window-sum-across-epochs with
  // those six or the buffer, and the one whose factors of K cancel
  // (no-loss-normalization+loss-divided-by-k-twice); and the copies with
  // items-counted-per-fetch-group.
  const size_t n = sample.size();
  const size_t all = 1 + n + n * (n - 1) / 2 - 2 - 6 - 7 - 1;
  EXPECT_EQ(candidate_semantics({}).size(), all + fetch_copies({}));
  for (const auto& sem : candidate_semantics({}))
    EXPECT_NE(semantics_name(sem),
              "no-loss-normalization+loss-divided-by-k-twice");
  // A run that stopped short: every pair (but the budget's own and those
  // left out above) also with step-budget-drops-micro-batches as a third.
  const size_t m = n - 1;  // the pairs without the budget
  EXPECT_EQ(candidate_semantics({.stopped_short = true}).size(),
            all + m * (m - 1) / 2 - 2 - 6 - 7 - 1 +
                fetch_copies({.stopped_short = true}));
  for (auto sem : candidate_semantics({.stopped_short = true})) {
    sem.erase(std::remove(sem.begin(), sem.end(), fetch), sem.end());
    if (sem.size() == 3) {
      EXPECT_EQ(sem.back(), Pitfall::step_budget_drops_micro_batches);
    }
  }
}

// ----------------------------------- per-window signatures of scenarios

// Z zero_grad, F forward_backward (one per non-empty rank shard), C clip,
// O optimizer_step, S scheduler_step, A all_reduce, U unscale, G
// scaler_update (the scale Grows or backs off), E ema_update.
std::string letters(const std::vector<Event>& events) {
  std::string p;
  for (const Event& e : events) p += "ZFCOSAUGE"[static_cast<int>(e.kind)];
  return p;
}

struct WindowShape {
  std::vector<int64_t> f;  // forward_backward calls per micro-step
  bool partial = false;
  bool last_of_epoch = false;
  int64_t epoch_micro_steps = 0, K = 1;
  bool clip = false;
  bool scaling = false, ema = false;  // [precision] loss_scale, [ema]
  bool overflow = false;              // an overflow injected in this window
};

// What the trainer called `id` does in one window, from the id alone.
std::string expected_signature(std::string_view id, const WindowShape& w) {
  const std::string C = w.clip ? "C" : "";
  const size_t n = w.f.size();
  auto F = [&](size_t k) { return std::string(size_t(w.f[k]), 'F'); };
  std::string s;
  if (id == "zero-grad-every-micro-step") {
    for (size_t k = 0; k < n; ++k) {
      s += 'Z';   // (one append each: GCC 12's -Wrestrict false positive
      s += F(k);  // on "Z" + string, PR105329)
    }
    return s + C + "OS";
  }
  if (id == "zero-grad-never") {
    for (size_t k = 0; k < n; ++k) s += F(k);
    return s + C + "OS";
  }
  if (id == "step-every-micro-step") {
    for (size_t k = 0; k < n; ++k) s += F(k) + C + "O";
    return s + "SZ";
  }
  if (id == "scheduler-per-micro-step") {
    for (size_t k = 0; k < n; ++k)
      s += F(k) + (k + 1 == n ? C + "OZ" : "") + "S";
    return s;
  }
  if (id == "clip-per-micro-step") {
    for (size_t k = 0; k < n; ++k) s += F(k) + C;
    return s + "OSZ";
  }
  if (id == "seed-002-loop") {
    for (size_t k = 0; k < n; ++k) {
      s += 'Z';   // (one append each: GCC 12's -Wrestrict false positive
      s += F(k);  // on "Z" + string, PR105329)
    }
    if (w.last_of_epoch && w.epoch_micro_steps % w.K == 0) s += C + "OSZ";
    return s;
  }
  for (size_t k = 0; k < n; ++k) s += F(k);
  if (w.partial && id == "partial-cycle-drop") return s + "Z";
  if (w.partial && id == "partial-cycle-leak") return s;
  // window-boundary-off-by-one leaves its partial windows (the epoch's
  // leftovers) unstepped; its re-cut of the epoch ([0], [1..K], ...) and
  // skip-short-micro-batch's dropped micro-batch happen in Trainer::run,
  // not in one window: tests/trainer_events_test.cpp pins those.
  if (w.partial && id == "window-boundary-off-by-one") return s;
  // window-counter-across-epochs leaks its leftovers likewise (the
  // shifted cut and step-budget-drops-micro-batches' stop are in
  // Trainer::run: TrainerEvents.TrainerBudget pins them).
  if (w.partial && id == "window-counter-across-epochs") return s;
  // items-counted-per-fetch-group's scenario pairs it with
  // window-counter-across-epochs (alone it changes nothing): the same
  // leak; its weights per fetch are the property
  // window.items-per-fetch-group's.
  if (w.partial && id == "items-counted-per-fetch-group") return s;
  if (id == "scheduler-before-optimizer") return s + "S" + C + "OZ";
  // Each micro-batch of the epoch's last window stepped alone.
  if (id == "end-of-loader-syncs-every-micro-batch" && w.last_of_epoch) {
    s.clear();
    for (size_t k = 0; k < n; ++k) s += F(k) + C + "OSZ";
    return s;
  }
  // Loss scaling and the EMA: unscale_ before the clip (after it for
  // clip-before-unscale), the step unless unscale_ found an overflow,
  // the scaler's update, the EMA after a step; the scheduler waits for a
  // skipped step unless skipped-step-advances-scheduler.
  if (w.scaling || w.ema) {
    const bool skip = w.scaling && w.overflow;
    std::string steps;
    std::string micro_extra;
    if (id == "scaler-update-every-micro-step" && w.scaling)
      micro_extra += "UG";
    if (id == "ema-every-micro-step" && w.ema) micro_extra += "E";
    steps.clear();
    for (size_t k = 0; k < n; ++k)
      steps += F(k) + (k + 1 < n ? micro_extra : "");
    std::string block;
    if (w.scaling)
      block = id == "clip-before-unscale" ? C + "U" : "U" + C;
    else
      block = C;
    if (!skip) block += "O";
    if (w.scaling) block += "G";
    if (w.ema && !skip) block += "E";
    const bool sched = !skip || id == "skipped-step-advances-scheduler";
    return steps + block + (sched ? "S" : "") + "Z";
  }
  // scheduler-per-epoch: scheduler.step() once after the epoch (in run()).
  if (id == "scheduler-per-epoch") return s + C + "OZ";
  // The correct pattern: every pitfall that changes only values.
  return s + C + "OSZ";
}

void check_signatures(const std::string& id, bool force_clip) {
  Scenario s = parse_scenario_file(kScenarios + id + ".toml");
  if (force_clip) {
    s.clip.enabled = true;
    s.clip.max_norm = 1.0;
  }
  // items-counted-per-fetch-group's scenario is that pitfall beside
  // window-counter-across-epochs, the only loop it changes.
  ASSERT_EQ(s.trainer.pitfalls.size(),
            id == "items-counted-per-fetch-group" ? 2u : 1u)
      << id;
  ASSERT_LT(s.batching.max_steps, 0) << id << ": every window must run";
  const Plan plan = materialize(make_plan(s));
  NullEngine e;
  Trainer<NullEngine> t(e, s, behavior_of(s.trainer.pitfalls), base_lr(s));
  TrainerCounters counters;
  int64_t global = 0;
  bool saw_partial = false;
  for (size_t ep = 0; ep < size_t(plan.epoch_count()); ++ep) {
    const EpochPlan epoch = plan.epoch(int64_t(ep));  // built or lazy
    for (size_t wi = 0; wi < epoch.windows.size(); ++wi, ++global) {
      const Window& w = epoch.windows[wi];
      WindowShape shape;
      for (const MicroBatch& m : w.micro) {
        int64_t f = 0;
        for (const auto& shard : m.shards) f += shard.empty() ? 0 : 1;
        shape.f.push_back(f);
      }
      shape.partial = w.partial;
      shape.last_of_epoch = wi + 1 == epoch.windows.size();
      shape.epoch_micro_steps = epoch.micro_steps();
      shape.K = plan.accumulation;
      shape.clip = s.clip.enabled;
      shape.scaling = s.precision.loss_scaling;
      shape.ema = s.ema.enabled;
      for (const auto& [ow, om] : s.precision.overflow)
        shape.overflow |= ow == global && om < int64_t(w.micro.size());
      saw_partial |= w.partial;
      const Run<double> run =
          t.run_window(w, plan.accumulation, counters, shape.last_of_epoch,
                       shape.epoch_micro_steps);
      counters = t.counters();
      ASSERT_EQ(letters(run.events), expected_signature(id, shape))
          << id << (force_clip ? " (clip on)" : "") << ": window " << global
          << " (epoch " << ep << ", " << w.micro.size() << " micro-batches"
          << (w.partial ? ", partial" : "") << ")";
    }
  }
  if (id.starts_with("partial-cycle")) {
    EXPECT_TRUE(saw_partial) << id << "'s scenario must have a partial window";
  }
}

TEST(PitfallCatalog, EachPitfallScenarioHasItsSignaturePerWindow) {
  for (const Expected& e : kTable) {
    if (std::string_view(e.id).starts_with("ddp-")) continue;  // per rank
    SCOPED_TRACE(e.id);
    check_signatures(e.id, false);
    check_signatures(e.id, true);
  }
}

// ---------------------- token N_w: the window gradient computed by hand

using R = OracleReal;

// The gradient of the first window of `s` (correct semantics) computed
// here: embedding -> Linear -> per-token cross-entropy, summed over the
// window's loss-bearing tokens (targets other than ignore_index) and
// divided by their count.  Plain loops over the dataset; nothing from the
// Trainer or an engine.
std::vector<R> window_gradient_by_hand(const Scenario& s, const Dataset& d,
                                       const std::vector<float>& p,
                                       const Window& w, int64_t& tokens) {
  const ParamLayout L = layout_of(s.model);
  const int64_t V = s.model.widths.back(), D = s.model.widths.front();
  const int64_t emb = L.tensors[0].offset, W = L.tensors[1].offset,
                bias = L.tensors[2].offset;
  std::vector<R> g(size_t(L.total), R(0));
  tokens = 0;
  for (const MicroBatch& m : w.micro)
    for (const auto& shard : m.shards)
      for (int64_t id : shard)
        for (int64_t t = 0; t < d.max_len; ++t)
          if (d.token_targets[size_t(id * d.max_len + t)] !=
              Dataset::kIgnoreIndex)
            ++tokens;
  for (const MicroBatch& m : w.micro)
    for (const auto& shard : m.shards)
      for (int64_t id : shard)
        for (int64_t t = 0; t < d.max_len; ++t) {
          const size_t at = size_t(id * d.max_len + t);
          const int32_t target = d.token_targets[at];
          if (target == Dataset::kIgnoreIndex) continue;
          const int64_t tok = d.tokens[at];
          std::vector<R> z(static_cast<size_t>(V)), dz(static_cast<size_t>(V));
          R zmax(-1e300), sum(0);
          for (int64_t j = 0; j < V; ++j) {
            R acc = R(p[size_t(bias + j)]);
            for (int64_t i = 0; i < D; ++i)
              acc +=
                  R(p[size_t(W + j * D + i)]) * R(p[size_t(emb + tok * D + i)]);
            z[size_t(j)] = acc;
            if (zmax < acc) zmax = acc;
          }
          for (int64_t j = 0; j < V; ++j) sum += R(exp(R(z[size_t(j)] - zmax)));
          for (int64_t j = 0; j < V; ++j)
            dz[size_t(j)] = R(exp(R(z[size_t(j)] - zmax))) / sum -
                            (j == target ? R(1) : R(0));
          for (int64_t j = 0; j < V; ++j) {
            g[size_t(bias + j)] += dz[size_t(j)];
            for (int64_t i = 0; i < D; ++i) {
              g[size_t(W + j * D + i)] +=
                  dz[size_t(j)] * R(p[size_t(emb + tok * D + i)]);
              g[size_t(emb + tok * D + i)] +=
                  dz[size_t(j)] * R(p[size_t(W + j * D + i)]);
            }
          }
        }
  for (R& x : g) x /= R(tokens);
  return g;
}

TEST(TokenWindowGradient, EqualsTheSumOverLossBearingTokensOverTokenCount) {
  for (const char* file :
       {"token-mean-of-means", "token-mean-of-means-fixed"}) {
    SCOPED_TRACE(file);
    Scenario s = parse_scenario_file(kScenarios + file + ".toml");
    ASSERT_EQ(s.model.kind, ModelKind::token);
    s.trainer.pitfalls.clear();  // the correct trainer
    s.clip.enabled = false;      // the raw accumulated gradient
    s.optimizer.l2_in_loss = 0;
    s.optimizer.weight_decay = 0;
    const Dataset d = make_dataset(s);
    const std::vector<float> p = initial_parameters(s, layout_of(s.model));
    const Plan plan = materialize(make_plan(s));
    const Window& w = plan.epochs.at(0).windows.at(0);

    int64_t tokens = 0;
    const std::vector<R> want = window_gradient_by_hand(s, d, p, w, tokens);
    // Padding exists in this window, so counting it would change N_w.
    int64_t positions = 0;
    for (const MicroBatch& m : w.micro)
      for (const auto& shard : m.shards)
        positions += int64_t(shard.size()) * d.max_len;
    if (std::string_view(file) == "token-mean-of-means") {
      ASSERT_LT(tokens, positions) << "the window must hold padding";
    }

    const std::vector<R> got = hole_test::first_step_gradient(s, d, p);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(hole_test::max_relative_difference(got, want),
              error_model::oracle_tolerance(oracle_digits()))
        << "the window gradient is not sum(token gradients) / N_w with N_w = "
        << tokens << " loss-bearing tokens (" << positions
        << " positions with padding)";
  }
}

}  // namespace
}  // namespace accumcheck
