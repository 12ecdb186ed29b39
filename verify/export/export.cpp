// The export bundle (verify/export/export.hpp).
#include "verify/export/export.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <system_error>

#include "sim/atomic_file.hpp"
#include "sim/data.hpp"
#include "sim/errors.hpp"
#include "sim/k_schedule.hpp"
#include "sim/layout.hpp"
#include "sim/limits.hpp"
#include "sim/plan.hpp"
#include "sim/scenario_parse.hpp"
#include "sim/trainer.hpp"
#include "verify/export/null_engine.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {

template class Trainer<NullEngine>;

namespace {

namespace fs = std::filesystem;

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::identity:
      return "identity";
    case Activation::tanh:
      return "tanh";
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
  }
  return "?";
}

std::string_view optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd:
      return "sgd";
    case OptimizerKind::adam:
      return "adam";
    case OptimizerKind::adamw:
      return "adamw";
  }
  return "?";
}

std::string_view schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::constant:
      return "constant";
    case ScheduleKind::step:
      return "step";
    case ScheduleKind::linear:
      return "linear";
    case ScheduleKind::cosine:
      return "cosine";
  }
  return "?";
}

std::string real(double x) { return fmt::format("{:.17g}", x); }

bool schedule_is_constant(const ScheduleSpec& s) {
  switch (s.kind) {
    case ScheduleKind::constant:
      return true;
    case ScheduleKind::step:
      return s.gamma == 1.0;
    default:
      return false;
  }
}

constexpr std::string_view kReadme = R"(accumcheck export bundle
========================

Train on this bundle with your own trainer, record a trace, then run

    accumcheck certify scenario.toml --trace TRACE_DIR

(the scenario file here is a byte copy; its digest is in
hyperparameters.csv and must appear in the trace's meta.csv).

Files (CSV, one header each; floats written with 17 significant digits,
exact in float32 and float64):
  data.csv             one row per sample: sample id, inputs x0.., then
                       targets y0.. (mse) or a class label (cross-entropy)
  tensors.csv          parameter tensors in PyTorch order and names
                       (nn.Sequential of Linear, then for hidden layers the
                       norm (BatchNorm1d, LayerNorm or GroupNorm, if any) and the
                       activation: with no norm, Linear l is "{2l}.weight"
                       [out x in] and "{2l}.bias" [out]; the names here are
                       the state_dict's)
  params.csv           the initial value of every parameter element
                       (row-major: index = row * cols + col)
  batches.csv          the micro-batch order: per epoch, window (global
                       optimizer-step window index), micro-step within the
                       window, rank, position in the micro-batch, sample id;
                       window_micro_batches (K_w) and window_items (N_w, the
                       samples of the window over all ranks)
  hyperparameters.csv  model, loss, optimizer, schedule, clipping, batching,
                       the accepted semantics and the scenario digest;
                       accumulation_per_epoch is K of each epoch (K may
                       change during training), total and warmup the
                       schedule's horizon as the accepted trainer counts it
  lr_schedule.csv      the learning rate of each optimizer step under the
                       accepted semantics
  scenario.toml        the scenario itself

Conventions (PyTorch): MSE loss per sample is the mean over outputs;
the accepted `correct` semantics weighs every sample of a window by 1/N_w
(loss/K when all K micro-batches hold equal samples); SGD momentum buffer
starts at the first gradient; Adam's t counts optimizer steps;
clip_grad_norm_ once per window on the accumulated gradient.

Trace schema: accumcheck-trace/2 (meta.csv, events.csv, values.csv;
events carry each micro-batch's sample ids; version 1 is still read);
see adapters/pytorch/accumcheck_torch/ for a recorder that writes it.
)";

// Moves `tmp` into place at `out`, replacing an empty folder or a
// previous bundle.
void install(const fs::path& tmp, const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) {
    fs::rename(tmp, out);
    return;
  }
  const bool empty = fs::is_directory(out) && fs::is_empty(out);
  const bool bundle = fs::is_directory(out) &&
                      fs::exists(out / "hyperparameters.csv") &&
                      fs::exists(out / "batches.csv");
  if (!empty && !bundle) {
    fs::remove_all(tmp, ec);
    throw InputError(out.string(), 0, 0, "--out",
                     "exists and is not an export bundle; refusing to "
                     "replace it (give a new or empty folder)");
  }
  fs::path old = out;
  old += ".old." + std::to_string(::getpid());
  fs::rename(out, old);
  fs::rename(tmp, out);
  fs::remove_all(old, ec);
}

// The copy of a [data] csv file in the bundle.
constexpr std::string_view kBundleCsv = "scenario-data.csv";

// The scenario text with its [data] csv value replaced by `name` (the
// value's source region, exclusive end, as toml++ reports it), checked by
// parsing the result.
std::string with_csv_path(const Scenario& s, const std::string& text,
                          std::string_view name) {
  const toml::table root = toml::parse(text, s.path);
  const toml::node* n = root.at_path("data.csv").node();
  if (!n || !n->is_string())
    throw std::logic_error("export: no data.csv string in " + s.path);
  const toml::source_region r = n->source();
  auto offset = [&](const toml::source_position& p) {
    size_t at = 0;
    for (uint32_t line = 1; line < p.line; ++line) at = text.find('\n', at) + 1;
    return at + (p.column - 1);
  };
  const size_t b = offset(r.begin), e = offset(r.end);
  std::string out = text.substr(0, b);
  out.append(fmt::format("\"{}\"", name));
  out.append(text.substr(e));
  const toml::table check = toml::parse(out, s.path);
  const auto v = check.at_path("data.csv").value<std::string>();
  if (!v || *v != name)
    throw std::logic_error("export: could not rewrite data.csv in " + s.path);
  return out;
}

// Epochs listed in batches.csv: all of them, or with max_steps those that
// hold max_steps windows plus one.
int64_t exported_epochs(const Scenario& s) {
  const ScenarioSize z = scenario_size(s);
  const int64_t per_epoch = z.windows_per_epoch.value_or(1);
  if (s.batching.max_steps < 0 || per_epoch < 1) return s.batching.epochs;
  const int64_t need = s.batching.max_steps / per_epoch +
                       (s.batching.max_steps % per_epoch != 0) + 1;
  return std::min(s.batching.epochs, need);
}

}  // namespace

std::vector<std::string> export_warnings(const Scenario& s) {
  std::vector<std::string> w;
  const int64_t K = s.batching.accumulation;
  if (K == 1)
    w.push_back(
        "K = 1: with no accumulation almost every pitfall is inert "
        "(normalization, zero_grad timing, partial windows, scheduler and "
        "clipping placement); certification can tell little apart");
  if (schedule_is_constant(s.schedule))
    w.push_back(
        "constant lr: scheduler-per-micro-step and "
        "schedule-horizon-in-micro-steps are invisible");
  // Every epoch has the same window and micro-batch sizes (only the
  // permutation differs): the first tells.
  const EpochPlan e = make_plan(s).epoch(0);
  bool partial = false, unequal = false;
  int64_t size = -1;
  for (const Window& win : e.windows) {
    partial = partial || win.partial;
    for (const MicroBatch& m : win.micro) {
      if (size >= 0 && m.items() != size) unequal = true;
      size = m.items();
    }
  }
  if (K > 1 && !partial)
    w.push_back(
        "K divides every epoch's micro-step count: no partial window, so "
        "partial-cycle-scale-by-k, partial-cycle-drop and partial-cycle-leak "
        "are invisible");
  if (K > 1 && !unequal)
    w.push_back(
        "every micro-batch holds the same number of samples: "
        "sample-mean-of-means is invisible");
  const OptimizerSpec& o = s.optimizer;
  if (o.kind == OptimizerKind::sgd && o.momentum == 0 && o.weight_decay == 0 &&
      o.l2_in_loss == 0 && !s.clip.enabled)
    w.push_back(
        "plain SGD without momentum, weight decay or clipping: "
        "no-loss-normalization is the correct trainer at K*lr (only the "
        "recorded gradients tell them apart)");
  if (!s.clip.enabled)
    w.push_back("no clipping: clip-per-micro-step is invisible");
  if (o.l2_in_loss == 0)
    w.push_back("no L2 in the loss: l2-in-loss-unnormalized is invisible");
  if (!k_changes(s.batching))
    w.push_back(
        "K is the same every epoch: ramp-normalization-stale and "
        "ramp-schedule-horizon-fixed are invisible");
  else if (!s.schedule.total_auto)
    w.push_back(
        "the schedule's horizon is fixed in the file (not total = \"auto\"): "
        "ramp-schedule-horizon-fixed is invisible");
  return w;
}

void require_exportable_model(const Scenario& s) {
  if (s.model.dropout != 0.0)
    throw InputError(s.path, 0, 0, "model.dropout",
                     "models with dropout are not exported or certified yet: "
                     "accumcheck keys masks by sample, PyTorch draws them in "
                     "call order, so a trainer could not reproduce them");
}

ExportResult export_bundle(const Scenario& s, const std::string& out_dir) {
  require_exportable_model(s);
  if (out_dir.empty())
    throw InputError("", 0, 0, "--out", "expected a folder, got ''");
  require_scenario_within_limits(s);
  std::string scenario_bytes = read_file_bytes(s.path, "scenario_bytes");
  // A [data] csv file travels with the bundle, and the bundle's
  // scenario.toml names the copy (so its digest is the bundle's own).
  std::string csv_bytes;
  std::string digest = s.digest;
  if (s.data.source == DataSource::csv) {
    csv_bytes = read_file_bytes(s.data.csv_path, "csv_bytes");
    scenario_bytes = with_csv_path(s, scenario_bytes, kBundleCsv);
    digest = digest_hex(scenario_bytes);
  }
  const Dataset data = make_dataset(s);
  const ParamLayout layout = layout_of(s.model);
  const std::vector<float> init = initial_parameters(s, layout);
  const Plan plan = make_plan(s);

  ExportResult r;
  r.warnings = export_warnings(s);
  std::vector<std::pair<std::string, std::string>> files;

  const bool token = s.model.kind == ModelKind::token;
  // N_w: a window's loss-bearing items, samples or (token models) tokens.
  auto window_items = [&](const Window& w) {
    if (!token) return w.items();
    int64_t n = 0;
    for (const MicroBatch& m : w.micro)
      for (const auto& shard : m.shards)
        for (int64_t id : shard) n += data.length[size_t(id)];
    return n;
  };
  if (token) {  // data.csv: one sequence per row, padded to max_len
    std::string o = "sample,length";
    for (int64_t j = 0; j < data.max_len; ++j) o.append(fmt::format(",t{}", j));
    for (int64_t j = 0; j < data.max_len; ++j) o.append(fmt::format(",y{}", j));
    o.push_back('\n');
    for (int64_t i = 0; i < data.n; ++i) {
      o.append(fmt::format("{},{}", i, data.length[size_t(i)]));
      for (int64_t j = 0; j < data.max_len; ++j)
        o.append(fmt::format(",{}", data.tokens[size_t(i * data.max_len + j)]));
      for (int64_t j = 0; j < data.max_len; ++j)
        o.append(fmt::format(",{}",
                             data.token_targets[size_t(i * data.max_len + j)]));
      o.push_back('\n');
    }
    files.emplace_back("data.csv", std::move(o));
  } else {  // data.csv
    std::string o = "sample";
    for (int64_t j = 0; j < data.d_in; ++j) o.append(fmt::format(",x{}", j));
    if (data.loss == LossKind::mse)
      for (int64_t j = 0; j < data.d_out; ++j) o.append(fmt::format(",y{}", j));
    else
      o.append(",label");
    o.push_back('\n');
    for (int64_t i = 0; i < data.n; ++i) {
      o.append(std::to_string(i));
      for (int64_t j = 0; j < data.d_in; ++j)
        o.append(",").append(real(data.input(i)[j]));
      if (data.loss == LossKind::mse)
        for (int64_t j = 0; j < data.d_out; ++j)
          o.append(",").append(real(data.target(i)[j]));
      else
        o.append(",").append(std::to_string(data.label[size_t(i)]));
      o.push_back('\n');
    }
    files.emplace_back("data.csv", std::move(o));
  }
  {  // tensors.csv, params.csv
    std::string t = "tensor,dims,rows,cols,offset\n";
    std::string p = "tensor,index,row,col,value\n";
    for (size_t k = 0; k < layout.tensors.size(); ++k) {
      const TensorView& v = layout.tensors[k];
      // 2-D: Linear weights and the embedding (uniform init); 1-D: biases
      // and norm weights.
      const bool bias = v.name.size() > 5 &&
                        v.name.compare(v.name.size() - 5, 5, ".bias") == 0;
      const bool matrix = !bias && v.init == TensorView::Init::uniform;
      t.append(fmt::format("{},{},{},{},{}\n", v.name, matrix ? 2 : 1, v.rows,
                           v.cols, v.offset));
      for (int64_t i = 0; i < v.size(); ++i)
        p.append(fmt::format("{},{},{},{},{}\n", v.name, i, i / v.cols,
                             i % v.cols, real(init[size_t(v.offset + i)])));
    }
    files.emplace_back("tensors.csv", std::move(t));
    files.emplace_back("params.csv", std::move(p));
  }
  {  // batches.csv
    std::string o =
        "epoch,window,micro,rank,position,sample,window_micro_batches,"
        "window_items,partial\n";
    int64_t window = 0;
    // With max_steps, the epochs holding max_steps windows and one more
    // (room for a trainer that skips windows); not the rest of a long run.
    const int64_t epochs = exported_epochs(s);
    for (int64_t e = 0; e < epochs; ++e)
      for (const Window& w : plan.epoch(e).windows) {
        for (size_t m = 0; m < w.micro.size(); ++m)
          for (size_t rk = 0; rk < w.micro[m].shards.size(); ++rk) {
            const auto& ids = w.micro[m].shards[rk];
            for (size_t pos = 0; pos < ids.size(); ++pos)
              o.append(fmt::format("{},{},{},{},{},{},{},{},{}\n", e, window, m,
                                   rk, pos, ids[pos], w.micro.size(),
                                   window_items(w), w.partial ? 1 : 0));
          }
        ++window;
      }
    files.emplace_back("batches.csv", std::move(o));
  }
  {  // lr_schedule.csv: the accepted semantics walked with no math
    NullEngine null;
    TrainerOptions opt;
    opt.record_values = false;
    opt.record_events = false;
    opt.max_steps = s.batching.max_steps;
    Trainer<NullEngine> t(null, s, behavior_of(s.trainer.accepted),
                          s.optimizer.lr, opt);
    const Run<double> run = t.run(plan, "accepted");
    std::string o = "step,epoch,window,lr\n";
    for (const StepRecord<double>& st : run.steps)
      o.append(fmt::format("{},{},{},{}\n", st.step, st.epoch, st.window,
                           real(st.lr)));
    r.steps = int64_t(run.steps.size());
    files.emplace_back("lr_schedule.csv", std::move(o));
  }
  {  // hyperparameters.csv
    std::vector<std::pair<std::string, std::string>> kv;
    std::string widths;
    for (int64_t w : s.model.widths) {
      if (!widths.empty()) widths.push_back(' ');
      widths.append(std::to_string(w));
    }
    const OptimizerSpec& o = s.optimizer;
    // K of every epoch; the schedule as the accepted trainer resolves it
    // (total = "auto": the run's optimizer steps).
    // K of the exported epochs only (batches.csv's: with max_steps, the
    // epochs that run); the adapter's accumulation_at() repeats the last.
    std::string k_per_epoch;
    for (int64_t e = 0; e < exported_epochs(s); ++e) {
      if (e) k_per_epoch.push_back(' ');
      k_per_epoch.append(std::to_string(accumulation_at(s.batching, e)));
    }
    const ScheduleSpec sched =
        resolved_schedule(s, behavior_of(s.trainer.accepted).horizon_initial_k);
    kv = {{"scenario", s.name},
          {"scenario_digest", digest},
          {"trace_schema", std::string(kTraceSchema)},
          {"accepted", semantics_name(s.trainer.accepted)},
          {"widths", widths},
          {"activation", std::string(activation_name(s.model.activation))},
          {"kind", token ? "token" : "mlp"},
          {"vocab", std::to_string(s.model.vocab)},
          {"embed", std::to_string(s.model.embed)},
          {"max_len", std::to_string(data.max_len)},
          {"norm", s.model.norm == NormKind::none        ? "none"
                   : s.model.norm == NormKind::batchnorm ? "batchnorm"
                   : s.model.norm == NormKind::layernorm ? "layernorm"
                                                         : "groupnorm"},
          {"norm_groups", std::to_string(s.model.norm_groups)},
          {"loss", s.model.loss == LossKind::mse ? "mse" : "cross-entropy"},
          {"samples", std::to_string(data.n)},
          {"micro_batch", std::to_string(s.batching.micro_batch)},
          {"accumulation", std::to_string(s.batching.accumulation)},
          {"accumulation_per_epoch", k_per_epoch},
          {"epochs", std::to_string(s.batching.epochs)},
          {"ranks", std::to_string(s.batching.ranks)},
          {"sampler", s.batching.sampler == Sampler::pad         ? "pad"
                      : s.batching.sampler == Sampler::drop_last ? "drop-last"
                                                                 : "split"},
          {"max_steps", std::to_string(s.batching.max_steps)},
          {"steps", std::to_string(r.steps)},
          {"optimizer", std::string(optimizer_name(o.kind))},
          {"lr", real(o.lr)},
          {"momentum", real(o.momentum)},
          {"beta1", real(o.beta1)},
          {"beta2", real(o.beta2)},
          {"eps", real(o.eps)},
          {"weight_decay", real(o.weight_decay)},
          {"l2_in_loss", real(o.l2_in_loss)},
          {"schedule", std::string(schedule_name(s.schedule.kind))},
          {"warmup", std::to_string(sched.warmup)},
          {"total", std::to_string(sched.total)},
          {"warmup_ratio", real(s.schedule.warmup_ratio)},
          {"step_size", std::to_string(s.schedule.step_size)},
          {"gamma", real(s.schedule.gamma)},
          {"clip", s.clip.enabled ? "1" : "0"},
          {"max_norm", real(s.clip.max_norm)}};
    std::string t = "key,value\n";
    for (const auto& [k, v] : kv)
      t.append(k).append(",").append(v).append("\n");
    files.emplace_back("hyperparameters.csv", std::move(t));
  }
  files.emplace_back("scenario.toml", scenario_bytes);
  if (s.data.source == DataSource::csv)
    files.emplace_back(std::string(kBundleCsv), std::move(csv_bytes));
  r.digest = digest;
  files.emplace_back("README.txt", std::string(kReadme));

  // Written under a temporary sibling folder, then renamed into place.
  fs::path out = fs::path(out_dir);
  if (!out.has_filename()) out = out.parent_path();
  fs::path tmp = out;
  tmp += ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    if (out.has_parent_path()) fs::create_directories(out.parent_path());
    fs::create_directory(tmp);
    for (const auto& [name, bytes] : files) {
      write_file_atomically((tmp / name).string(), bytes);
      r.files.push_back(name);
    }
    install(tmp, out);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw InputError(out.string(), 0, 0, "--out", e.what());
  } catch (const std::system_error& e) {
    fs::remove_all(tmp, ec);
    throw InputError(out.string(), 0, 0, "--out", e.what());
  }
  return r;
}

}  // namespace accumcheck
