// Scenario files: TOML -> Scenario with precise errors (the inverse,
// to_toml() and describe(), is sim/scenario_write.cpp).  [batching] with
// its K schedule and [schedule] are sim/scenario_parse_batching.cpp, the
// reading machinery (Parser, Section) sim/scenario_reader.hpp.
#include "sim/scenario_parse.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "sim/atomic_file.hpp"
#include "sim/data.hpp"
#include "sim/errors.hpp"
#include "sim/k_schedule.hpp"
#include "sim/layout.hpp"
#include "sim/limits.hpp"
#include "sim/scenario_reader.hpp"
#include "sim/scenario_text.hpp"

namespace accumcheck {

using namespace scenario_text;
using namespace scenario_reader;

namespace {

std::vector<Pitfall> pitfall_list(const Parser& p, const Section& sec,
                                  std::string_view k) {
  std::vector<Pitfall> out;
  const toml::node* n = sec.node(k);
  if (!n) return out;
  const auto* arr = n->as_array();
  if (!arr) sec.bad(k, "an array of pitfall ids");
  std::vector<std::string_view> ids;
  for (Pitfall q : kAllPitfalls) ids.push_back(pitfall_id(q));
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::node& el = (*arr)[i];
    const std::string key = fmt::format("{}[{}]", sec.key(k), i);
    if (!el.is_string())
      p.fail(&el, key, "expected a pitfall id (a string), " + got(el));
    const std::string& id = el.as_string()->get();
    const std::optional<Pitfall> q = pitfall_from_id(id);
    if (!q) {
      std::string msg = fmt::format("unknown pitfall id '{}'", id);
      const std::string_view guess = closest(id, ids);
      if (!guess.empty()) msg += fmt::format("; did you mean '{}'?", guess);
      p.fail(&el, key, msg + " Known ids: " + Section::join(ids));
    }
    if (std::find(out.begin(), out.end(), *q) != out.end())
      p.fail(&el, key, fmt::format("pitfall id '{}' listed twice", id));
    out.push_back(*q);
  }
  return out;
}

// The parameter count against its limit (widths and layers are bounded
// by then, so layout_of() cannot overflow).
void check_parameters(const Parser& p, const Section& sec, const ModelSpec& m) {
  const char* k = m.kind == ModelKind::token ? "vocab" : "widths";
  const int64_t n = layout_of(m).total;
  p.within(sec.node(k), sec.key(k), "parameters", n,
           fmt::format("the model's {} parameters", n));
}

void parse_model(const Parser& p, const Section& sec, ModelSpec& m) {
  m.kind = sec.choice("kind", kModelKinds).value_or(ModelKind::mlp);
  if (m.kind == ModelKind::token) {
    const std::string why = "does not apply to kind = \"token\"";
    for (std::string_view k :
         {"widths", "activation", "norm", "norm_groups", "dropout"})
      sec.forbid(k, why + " (embedding -> linear -> cross-entropy)");
    m.vocab = sec.required_integer("vocab", 2);
    m.embed = sec.required_integer("embed", 1);
    for (const auto& [k, v] : {std::pair{"vocab", m.vocab}, {"embed", m.embed}})
      p.within(sec.node(k), sec.key(k), "width", v,
               fmt::format("model.{} = {}", k, v));
    m.widths = {m.embed, m.vocab};
    m.activation = Activation::identity;
    m.loss = sec.choice("loss", kLosses).value_or(LossKind::cross_entropy);
    if (m.loss != LossKind::cross_entropy)
      p.fail(sec.node("loss"), "model.loss",
             "a token model's loss is \"cross-entropy\" (per token)");
    check_parameters(p, sec, m);
    return;
  }
  for (std::string_view k : {"vocab", "embed"})
    sec.forbid(k, "applies to kind = \"token\" only");
  m.norm = sec.choice("norm", kNorms).value_or(NormKind::none);
  m.dropout = sec.number("dropout", kUnitInterval).value_or(0.0);
  const toml::node* wn = sec.node("widths");
  if (!wn) sec.missing("widths", "an array of >= 2 layer widths");
  const auto* arr = wn->as_array();
  if (!arr || arr->size() < 2)
    sec.bad("widths", "an array of >= 2 layer widths {d_in, ..., d_out}");
  m.widths.clear();
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::node& el = (*arr)[i];
    const auto* v = el.as_integer();
    const std::string key = fmt::format("model.widths[{}]", i);
    if (!v || v->get() < 1)
      p.fail(
          &el, key,
          fmt::format("expected {}, {}", int_range_text(1, kIntMax), got(el)));
    p.within(&el, key, "width", v->get(),
             fmt::format("{} = {}", key, v->get()));
    m.widths.push_back(v->get());
  }
  p.within(wn, "model.widths", "layers", int64_t(arr->size()) - 1,
           fmt::format("{} Linear layers ({} widths)", arr->size() - 1,
                       arr->size()));
  if (m.widths.size() < 3) {
    if (m.norm != NormKind::none)
      p.fail(sec.node("norm"), "model.norm",
             "a norm follows each hidden Linear: model.widths needs >= 3 "
             "entries (a hidden layer)");
    if (m.dropout > 0)
      p.fail(sec.node("dropout"), "model.dropout",
             "dropout follows each hidden activation: model.widths needs "
             ">= 3 entries (a hidden layer)");
  }
  if (m.norm == NormKind::layernorm)
    for (size_t i = 1; i + 1 < m.widths.size(); ++i)
      if (m.widths[i] < 2)
        p.fail(&(*arr)[i], fmt::format("model.widths[{}]", i),
               "LayerNorm normalizes over a hidden layer's features: each "
               "hidden width must be >= 2");
  if (m.norm == NormKind::groupnorm) {
    // nn.GroupNorm(num_groups, C) needs num_groups to divide C; a group
    // of one feature has variance 0 (rstd = 1/sqrt(eps)), so >= 2 each.
    m.norm_groups = sec.required_integer("norm_groups", 1);
    for (size_t i = 1; i + 1 < m.widths.size(); ++i)
      if (m.widths[i] % m.norm_groups != 0 || m.widths[i] / m.norm_groups < 2)
        p.fail(&(*arr)[i], fmt::format("model.widths[{}]", i),
               fmt::format("GroupNorm with norm_groups = {} splits each hidden "
                           "width into groups of >= 2 features: the width "
                           "must be a multiple of {}, got {}",
                           m.norm_groups, 2 * m.norm_groups, m.widths[i]));
  } else {
    sec.forbid("norm_groups", "applies to norm = \"groupnorm\" only");
  }
  m.activation =
      sec.choice("activation", kActivations).value_or(Activation::tanh);
  m.loss = sec.choice("loss", kLosses).value_or(LossKind::mse);
  if (m.loss == LossKind::cross_entropy && m.d_out() < 2)
    p.fail(sec.node("loss"), "model.loss",
           fmt::format("cross-entropy needs d_out >= 2 classes (the last "
                       "entry of model.widths), got {}",
                       m.d_out()));
  check_parameters(p, sec, m);
}

std::string resolve_csv(const std::string& scenario_path,
                        const std::string& csv) {
  namespace fs = std::filesystem;
  fs::path p(csv);
  if (p.is_relative()) {
    std::error_code ec;
    fs::path base = fs::absolute(fs::path(scenario_path), ec).parent_path();
    p = base / p;
  }
  return p.lexically_normal().string();
}

void parse_data(const Parser& p, const Section& sec, Scenario& s) {
  DataSpec& d = s.data;
  d.seed = uint64_t(sec.integer("seed", 0).value_or(0));
  d.dyadic = sec.boolean("dyadic").value_or(false);
  d.shuffle = sec.boolean("shuffle").value_or(true);
  d.replicate = sec.boolean("replicate").value_or(false);
  d.pinned_order = sec.boolean("pinned_order").value_or(false);
  if (d.replicate && d.shuffle)
    p.fail(sec.node("replicate"), "data.replicate",
           "replicated micro-batches need shuffle = false (a shuffle would "
           "mix the copies)");
  if (s.model.kind == ModelKind::token) {
    sec.forbid("csv", "does not apply to kind = \"token\" (generated only)");
    sec.forbid("dyadic", "does not apply to kind = \"token\"");
    d.lengths =
        sec.choice("lengths", kLengths).value_or(SequenceLengths::fixed);
    d.max_len = sec.required_integer("max_len", 1, 1 << 16);
    if (d.lengths == SequenceLengths::fixed) {
      sec.forbid("min_len",
                 "applies to lengths = \"uniform\" or "
                 "\"long-tailed\" only");
      d.min_len = d.max_len;
    } else {
      d.min_len = sec.integer("min_len", 1, d.max_len).value_or(1);
    }
  } else {
    for (std::string_view k : {"lengths", "min_len", "max_len"})
      sec.forbid(k, "applies to [model] kind = \"token\" only");
  }
  const std::optional<int64_t> samples = sec.integer("samples", 1);
  if (const std::optional<std::string> csv = sec.string("csv")) {
    sec.forbid("replicate", "applies to generated data only");
    if (csv->empty()) sec.bad("csv", "a path to a CSV file");
    d.source = DataSource::csv;
    d.csv_path = resolve_csv(p.file(), *csv);
    d.samples = 0;
    // The file itself is reported at the key (what it holds, at its own
    // lines by the reader).
    if (const std::string why = why_not_a_file(d.csv_path); !why.empty())
      p.fail(sec.node("csv"), "data.csv",
             fmt::format("expected a CSV file, got '{}': {} {}", *csv,
                         d.csv_path, why));
    // Reads and checks the whole file (header against the model, every
    // value); the row count is the sample count.
    const Dataset ds = make_dataset(s);
    if (samples && *samples != ds.n)
      p.fail(sec.node("samples"), "data.samples",
             fmt::format("expected {} (the rows of {}) or no value, got {}",
                         ds.n, d.csv_path, *samples));
    d.samples = ds.n;
  } else {
    d.source = DataSource::generated;
    if (!samples) sec.missing("samples", "an integer >= 1 (or a csv file)");
    d.samples = *samples;
  }
  // Before anything is generated for them (the CSV's size was bounded by
  // its file-size limit before it was read).
  const toml::node* n = sec.node("samples");
  p.within(n, "data.samples", "samples", d.samples,
           fmt::format("data.samples = {}", d.samples));
  const int64_t per_sample = s.model.kind == ModelKind::token
                                 ? 2 * d.max_len
                                 : s.model.d_in() + s.model.d_out();
  p.within(n, "data.samples", "data_values", checked_mul(d.samples, per_sample),
           fmt::format("data.samples = {} x {} values per sample", d.samples,
                       per_sample));
}

// Settings that span sections (after [model], [data], [batching] and
// [trainer] are read).
void validate_across(const Parser& p, const Section& model, const Section& data,
                     const Section& batching, const Section& trainer,
                     const Scenario& s) {
  const BatchingSpec& b = s.batching;
  if (s.data.replicate) {
    if (s.data.samples % b.micro_batch != 0 || b.ranks != 1)
      p.fail(data.node("replicate"), "data.replicate",
             fmt::format("replicated micro-batches need data.samples a "
                         "multiple of batching.micro_batch and one rank "
                         "(got samples = {}, micro_batch = {}, ranks = {})",
                         s.data.samples, b.micro_batch, b.ranks));
  }
  if (s.model.norm == NormKind::batchnorm) {
    // PyTorch refuses a training-mode BatchNorm1d batch of one sample.
    const int64_t per_rank = (s.data.samples + b.ranks - 1) / b.ranks;
    const int64_t last = per_rank % b.micro_batch;
    if (b.micro_batch < 2 || per_rank < 2 || last == 1)
      p.fail(batching.node("micro_batch"), "batching.micro_batch",
             fmt::format(
                 "norm = \"batchnorm\" needs every micro-batch to hold >= 2 "
                 "samples (PyTorch: \"Expected more than 1 value per channel "
                 "when training\"); micro_batch = {} over {} samples per rank "
                 "leaves a micro-batch of {}",
                 b.micro_batch, per_rank,
                 b.micro_batch < 2 || per_rank < 2
                     ? std::min(b.micro_batch, per_rank)
                     : last));
  }
  (void)model;
  const bool token = s.model.kind == ModelKind::token;
  for (const char* key : {"pitfalls", "accepted"}) {
    const auto& list = std::string_view(key) == "pitfalls" ? s.trainer.pitfalls
                                                           : s.trainer.accepted;
    for (size_t i = 0; i < list.size(); ++i) {
      const toml::node* arr = trainer.node(key);
      const toml::node* el =
          arr && arr->as_array() ? arr->as_array()->get(i) : nullptr;
      const std::string k = fmt::format("trainer.{}[{}]", key, i);
      if (list[i] == Pitfall::token_mean_of_means && !token)
        p.fail(el, k,
               "'token-mean-of-means' is for token losses ([model] kind = "
               "\"token\"); sample losses use 'sample-mean-of-means'");
      if (list[i] == Pitfall::token_count_unshifted_labels && !token)
        p.fail(el, k,
               "'token-count-unshifted-labels' is for token losses ([model] "
               "kind = \"token\"): a sample loss has no label positions");
      if (list[i] == Pitfall::sample_mean_of_means && token)
        p.fail(el, k,
               "'sample-mean-of-means' is for sample losses; a token model "
               "uses 'token-mean-of-means'");
    }
  }
}

void parse_optimizer(const Section& sec, OptimizerSpec& o) {
  o = OptimizerSpec{};
  o.kind = sec.choice("kind", kOptimizers).value_or(OptimizerKind::sgd);
  o.lr = sec.required_number("lr", kPositive);
  if (o.kind == OptimizerKind::sgd) {
    for (std::string_view k : {"beta1", "beta2", "eps"})
      sec.forbid(k, "applies to kind = \"adam\" or \"adamw\" only");
    o.momentum = sec.number("momentum", kUnitInterval).value_or(0.0);
  } else {
    sec.forbid("momentum", "applies to kind = \"sgd\" only");
    o.beta1 = sec.number("beta1", kUnitInterval).value_or(o.beta1);
    o.beta2 = sec.number("beta2", kUnitInterval).value_or(o.beta2);
    o.eps = sec.number("eps", kPositive).value_or(o.eps);
  }
  o.weight_decay = sec.number("weight_decay", kNonNegative).value_or(0.0);
  o.l2_in_loss = sec.number("l2_in_loss", kNonNegative).value_or(0.0);
}

void parse_expect(const Parser& p, const Section& sec, const Scenario& s,
                  ExpectSpec& e) {
  e = ExpectSpec{};
  e.kind =
      sec.choice("verdict", kVerdicts).value_or(ExpectKind::matches_reference);
  if (e.kind == ExpectKind::diverges_from_reference) {
    e.min_distance = sec.required_number("min_distance", kPositive);
    e.at_step = sec.integer("at_step", -1).value_or(-1);
    // Windows count from 0; the runs are compared at window ends.
    const std::optional<int64_t> windows = scenario_size(s).windows;
    if (e.at_step >= 0 && windows && e.at_step >= *windows)
      p.fail(
          sec.node("at_step"), "expect.at_step",
          fmt::format("expected a window in 0..{} (the run has {} windows: "
                      "{} epochs x {} per epoch{}), got {}",
                      *windows - 1, *windows, s.batching.epochs,
                      scenario_size(s).windows_per_epoch.value_or(0),
                      s.batching.max_steps >= 0
                          ? fmt::format(", max_steps {}", s.batching.max_steps)
                          : std::string(),
                      e.at_step));
  } else {
    sec.forbid("min_distance",
               "applies to verdict = \"diverges-from-reference\" only");
    sec.forbid("at_step",
               "applies to verdict = \"diverges-from-reference\" only");
  }
}

constexpr std::string_view kSections[] = {
    "model", "data",    "batching",  "optimizer", "schedule",
    "clip",  "trainer", "precision", "ema",       "expect"};

}  // namespace

Scenario parse_scenario_string(std::string_view text,
                               const std::string& path_for_errors) {
  const Parser p(path_for_errors);
  toml::table root;
  try {
    root = toml::parse(text, std::string(path_for_errors));
  } catch (const toml::parse_error& e) {
    p.fail(e.source(), "",
           "TOML syntax error: " + std::string(e.description()));
  }

  // Top level: `story` and the known sections only.
  for (auto&& [k, v] : root) {
    if (k.str() == "story") continue;
    if (std::find(std::begin(kSections), std::end(kSections), k.str()) !=
        std::end(kSections))
      continue;
    std::vector<std::string_view> known(std::begin(kSections),
                                        std::end(kSections));
    const bool table = v.is_table();
    if (!table) known.push_back("story");
    std::string msg = table ? fmt::format("unknown section [{}]", k.str())
                            : fmt::format("unknown key '{}'", k.str());
    const std::string_view guess = closest(k.str(), known);
    if (!guess.empty())
      msg += table ? fmt::format("; did you mean [{}]?", guess)
                   : fmt::format("; did you mean '{}'?", guess);
    else
      msg += fmt::format(
          "; expected 'story' or a section [{}]",
          Section::join({std::begin(kSections), std::end(kSections)}));
    p.fail(k.source(), std::string(k.str()), msg);
  }

  Scenario s;
  s.path = path_for_errors;
  s.name = std::filesystem::path(path_for_errors).stem().string();
  s.digest = digest_hex(text);

  const toml::node* story = root.get("story");
  if (!story)
    p.fail(nullptr, "story",
           "missing required key 'story'; expected a one-line description");
  if (!story->is_string() || story->as_string()->get().empty() ||
      story->as_string()->get().find('\n') != std::string::npos)
    p.fail(story, "story",
           "expected a non-empty one-line string, " + got(*story));
  s.story = story->as_string()->get();

  const Section model(p, root, "model",
                      {"widths", "activation", "loss", "kind", "norm",
                       "norm_groups", "dropout", "vocab", "embed"});
  const Section data(
      p, root, "data",
      {"samples", "seed", "dyadic", "shuffle", "csv", "replicate", "lengths",
       "min_len", "max_len", "pinned_order"});
  const Section batching(p, root, "batching",
                         {"micro_batch", "accumulation", "epochs", "ranks",
                          "max_steps", "sampler"});
  const Section optimizer(p, root, "optimizer",
                          {"kind", "lr", "momentum", "beta1", "beta2", "eps",
                           "weight_decay", "l2_in_loss"});
  const Section schedule(p, root, "schedule",
                         {"kind", "warmup", "warmup_ratio", "total",
                          "step_size", "gamma", "frequency"});
  const Section clip(p, root, "clip", {"max_norm"});
  const Section trainer(p, root, "trainer",
                        {"pitfalls", "accepted", "lr_scaling"});
  const Section precision(
      p, root, "precision",
      {"grad_buffer", "loss_scale", "init_scale", "growth_factor",
       "backoff_factor", "growth_interval", "overflow"});
  const Section ema(p, root, "ema", {"decay"});
  const Section expect(p, root, "expect",
                       {"verdict", "min_distance", "at_step"});

  // Where the keys whose limits wait for a command's overrides were
  // written (require_scenario_within_limits reports there).
  for (const auto& [sec, k] :
       {std::pair<const Section*, std::string_view>{&model, "widths"},
        {&model, "vocab"},
        {&data, "samples"},
        {&batching, "epochs"}})
    if (const toml::node* n = sec->node(k))
      s.written_at[sec->key(k)] = {int64_t(n->source().begin.line),
                                   int64_t(n->source().begin.column)};

  parse_model(p, model, s.model);
  parse_data(p, data, s);
  parse_batching(p, batching, s);
  parse_optimizer(optimizer, s.optimizer);
  parse_schedule(p, schedule, s.schedule);
  if (const std::optional<double> c = clip.number("max_norm", kPositive)) {
    s.clip.enabled = true;
    s.clip.max_norm = *c;
  }
  s.trainer.pitfalls = pitfall_list(p, trainer, "pitfalls");
  s.trainer.accepted = pitfall_list(p, trainer, "accepted");
  s.trainer.lr_scaling =
      trainer.choice("lr_scaling", kLrScalings).value_or(LrScaling::none);
  if (s.trainer.lr_scaling != LrScaling::none && k_changes(s.batching))
    p.fail(trainer.node("lr_scaling"), "trainer.lr_scaling",
           "the lr-scaling lesson scales by one K; batching.accumulation "
           "changes from epoch to epoch here");
  parse_precision(p, precision, ema, s);
  validate_across(p, model, data, batching, trainer, s);
  parse_expect(p, expect, s, s.expect);
  return s;
}

Scenario parse_scenario_file(const std::string& path) {
  return parse_scenario_string(read_file_bytes(path, "scenario_bytes"), path);
}

}  // namespace accumcheck
