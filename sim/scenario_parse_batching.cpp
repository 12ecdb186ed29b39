// Scenario files, [batching] (micro-batch, ranks, sampler and the K
// schedule: one K, K per epoch, or a ramp rule) and [schedule] (the
// learning-rate schedule and its horizon).  The rest of the parser is
// sim/scenario_parse.cpp.
#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sim/limits.hpp"
#include "sim/scenario_reader.hpp"

namespace accumcheck::scenario_reader {

// K = 0 is what seed 002's cold-start advice computes in epoch 0; its loop
// then fails on `% 0`.
constexpr std::string_view kSeed002KZeroHint =
    "; hint: seed 002's cold start `accumulation_steps = min(epoch * 2, 8)` "
    "gives K = 0 in epoch 0 (its loop then fails on `% 0`): start the ramp "
    "at K >= 1, e.g. accumulation = [2, 4, 6, 8, 8] for its epochs 1..5";

// batching.accumulation: K (an integer), K per epoch (an array of one
// integer per epoch), or a ramp rule { start, step, max }: K_e =
// min(start + e * step, max) for epochs e = 0, 1, ...
void parse_accumulation(const Parser& p, const Section& sec, BatchingSpec& b) {
  const toml::node* n = sec.node("accumulation");
  if (!n)
    sec.missing("accumulation",
                "an integer >= 1, an array of one K per epoch, or a ramp "
                "{ start, step, max }");
  auto k_value = [&](const toml::node& el, const std::string& key) {
    const auto* v = el.as_integer();
    if (!v || v->get() < 1 || v->get() > kIntMax)
      p.fail(&el, key,
             fmt::format("expected an integer >= 1, {}{}", got(el),
                         v && v->get() == 0 ? kSeed002KZeroHint : ""));
    return v->get();
  };
  b.accumulation_per_epoch.clear();
  b.accumulation_ramp.reset();
  if (n->is_integer()) {
    b.accumulation = k_value(*n, "batching.accumulation");
    return;
  }
  if (const auto* arr = n->as_array()) {
    if (int64_t(arr->size()) != b.epochs)
      p.fail(n, "batching.accumulation",
             fmt::format("expected one K per epoch ({} entries for "
                         "batching.epochs = {}), got {}",
                         b.epochs, b.epochs, arr->size()));
    for (size_t i = 0; i < arr->size(); ++i)
      b.accumulation_per_epoch.push_back(
          k_value((*arr)[i], fmt::format("batching.accumulation[{}]", i)));
  } else if (const auto* t = n->as_table()) {
    for (auto&& [k, v] : *t) {
      (void)v;
      if (k.str() != "start" && k.str() != "step" && k.str() != "max")
        p.fail(k.source(), "batching.accumulation." + std::string(k.str()),
               fmt::format("unknown key '{}' in the ramp; known keys: start, "
                           "step, max",
                           k.str()));
    }
    auto field = [&](std::string_view k, int64_t lo) {
      const toml::node* f = t->get(k);
      const std::string key = "batching.accumulation." + std::string(k);
      if (!f)
        p.fail(n, key,
               fmt::format("missing required key '{}' of the ramp {{ start, "
                           "step, max }}; expected {}",
                           k, int_range_text(lo, kIntMax)));
      const auto* v = f->as_integer();
      if (!v || v->get() < lo)
        p.fail(
            f, key,
            fmt::format(
                "expected {}, {}{}", int_range_text(lo, kIntMax), got(*f),
                k == "start" && v && v->get() == 0 ? kSeed002KZeroHint : ""));
      return v->get();
    };
    const int64_t start = field("start", 1), step = field("step", 0),
                  max = field("max", 1);
    // K_e = min(start + e * step, max), saturating (no overflow); kept
    // until it stops changing (accumulation_at repeats the last entry), and
    // for at most `windows` + 1 epochs: every epoch holds at least one
    // optimizer window, so a run within the windows limit (or cut by
    // max_steps / --steps, which that limit also bounds) never reaches a
    // later epoch, while { start = 1, step = 1, max = 2^62 } with 10^12
    // epochs would otherwise store 10^12 entries before any limit is read.
    b.accumulation_ramp = BatchingSpec::Ramp{start, step, max};
    const int64_t stored_max = std::min(b.epochs, limit("windows") + 1);
    int64_t k = std::min(start, max);
    for (int64_t e = 0; e < stored_max; ++e) {
      b.accumulation_per_epoch.push_back(k);
      if (k == max || step == 0) break;
      k = max - k <= step ? max : k + step;
    }
  } else {
    sec.bad("accumulation",
            "an integer >= 1, an array of one K per epoch, or a ramp "
            "{ start, step, max }");
  }
  b.accumulation = b.accumulation_per_epoch.front();
}

void parse_batching(const Parser& p, const Section& sec, Scenario& s) {
  BatchingSpec& b = s.batching;
  b.micro_batch = sec.required_integer("micro_batch", 1);
  b.epochs = sec.integer("epochs", 1).value_or(1);
  parse_accumulation(p, sec, b);
  b.ranks = sec.integer("ranks", 1).value_or(1);
  b.max_steps = sec.integer("max_steps", -1).value_or(-1);
  b.sampler = sec.choice("sampler", kSamplers).value_or(Sampler::pad);
  if (b.micro_batch > s.data.samples)
    p.fail(sec.node("micro_batch"), "batching.micro_batch",
           fmt::format("expected an integer in 1..{} (data.samples), got {}",
                       s.data.samples, b.micro_batch));
  if (b.ranks > s.data.samples)
    p.fail(sec.node("ranks"), "batching.ranks",
           fmt::format("expected an integer in 1..{} (data.samples), got {}",
                       s.data.samples, b.ranks));
}

void parse_schedule(const Parser& p, const Section& sec, ScheduleSpec& sc) {
  sc = ScheduleSpec{};
  sc.kind = sec.choice("kind", kSchedules).value_or(ScheduleKind::constant);
  const bool horizon =
      sc.kind == ScheduleKind::linear || sc.kind == ScheduleKind::cosine;
  if (!horizon) {
    sec.forbid("warmup", "applies to kind = \"linear\" or \"cosine\" only");
    sec.forbid("total", "applies to kind = \"linear\" or \"cosine\" only");
    sec.forbid("warmup_ratio",
               "applies to kind = \"linear\" or \"cosine\" only");
  }
  if (sc.kind != ScheduleKind::step) {
    sec.forbid("step_size", "applies to kind = \"step\" only");
    sec.forbid("gamma", "applies to kind = \"step\" only");
  }
  const toml::node* total = sec.node("total");
  if (horizon && total && total->is_string() &&
      total->as_string()->get() == "auto") {
    // The horizon is the run's optimizer steps (sim/k_schedule.hpp).
    sc.total_auto = true;
    if (sec.has("warmup") && sec.has("warmup_ratio"))
      sec.forbid("warmup_ratio", "and 'warmup' exclude each other");
    sc.warmup = sec.integer("warmup", 0).value_or(0);
    sc.warmup_ratio = sec.number("warmup_ratio", kUnitInterval).value_or(-1);
  } else if (horizon) {
    if (total && total->is_string())
      sec.bad("total", "an integer >= 1 or \"auto\"");
    sec.forbid("warmup_ratio", "applies to total = \"auto\" only");
    sc.warmup = sec.integer("warmup", 0).value_or(0);
    sc.total = sec.required_integer("total", 1);
    if (sc.total <= sc.warmup)
      p.fail(sec.node("total"), "schedule.total",
             fmt::format("expected an integer > schedule.warmup = {}, got {}",
                         sc.warmup, sc.total));
  } else if (sc.kind == ScheduleKind::step) {
    sc.step_size = sec.integer("step_size", 1).value_or(1);
    sc.gamma = sec.number("gamma", kPositive).value_or(sc.gamma);
  }
  sc.frequency = sec.integer("frequency", 1).value_or(1);
}

}  // namespace accumcheck::scenario_reader
