// Scenario -> TOML (to_toml) and the one-line description (describe), the
// inverse of sim/scenario_parse.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/k_schedule.hpp"
#include "sim/pitfalls.hpp"
#include "sim/scenario_parse.hpp"
#include "sim/scenario_text.hpp"

namespace accumcheck {

namespace scenario_text {

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if ((unsigned char)c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", (unsigned)(unsigned char)c);
        else
          out += c;
    }
  }
  return out + "\"";
}

std::string float_text(double x) {
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace scenario_text

using namespace scenario_text;

std::string to_toml(const Scenario& s) {
  std::string o;
  auto line = [&o](std::string_view key, const std::string& value) {
    o += fmt::format("{} = {}\n", key, value);
  };
  auto integer = [](int64_t v) { return std::to_string(v); };
  auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };
  auto ids = [](const std::vector<Pitfall>& v) {
    std::string r = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) r += ", ";
      r += toml_string(pitfall_id(v[i]));
    }
    return r + "]";
  };

  line("story", toml_string(s.story));

  o += "\n[model]\n";
  if (s.model.kind == ModelKind::token) {
    line("kind", toml_string("token"));
    line("vocab", integer(s.model.vocab));
    line("embed", integer(s.model.embed));
    line("loss", toml_string(name_of<LossKind>(kLosses, s.model.loss)));
  } else {
    std::string widths = "[";
    for (size_t i = 0; i < s.model.widths.size(); ++i) {
      if (i) widths += ", ";
      widths += integer(s.model.widths[i]);
    }
    line("widths", widths + "]");
    line("activation",
         toml_string(name_of<Activation>(kActivations, s.model.activation)));
    line("loss", toml_string(name_of<LossKind>(kLosses, s.model.loss)));
    if (s.model.norm != NormKind::none)
      line("norm", toml_string(name_of<NormKind>(kNorms, s.model.norm)));
    if (s.model.norm == NormKind::groupnorm)
      line("norm_groups", integer(s.model.norm_groups));
    if (s.model.dropout > 0) line("dropout", float_text(s.model.dropout));
  }

  o += "\n[data]\n";
  if (s.data.source == DataSource::csv)
    line("csv", toml_string(s.data.csv_path));
  line("samples", integer(s.data.samples));
  // TOML integers are signed 64-bit: a larger seed has no spelling.
  if (s.data.seed > uint64_t(kIntMax))
    throw std::invalid_argument(fmt::format(
        "to_toml: data.seed {} does not fit a TOML integer (< 2^63)",
        s.data.seed));
  line("seed", std::to_string(s.data.seed));
  if (s.model.kind != ModelKind::token) line("dyadic", boolean(s.data.dyadic));
  line("shuffle", boolean(s.data.shuffle));
  if (s.data.replicate) line("replicate", boolean(true));
  if (s.data.pinned_order) line("pinned_order", boolean(true));
  if (s.model.kind == ModelKind::token) {
    line("lengths",
         toml_string(name_of<SequenceLengths>(kLengths, s.data.lengths)));
    if (s.data.lengths != SequenceLengths::fixed)
      line("min_len", integer(s.data.min_len));
    line("max_len", integer(s.data.max_len));
  }

  o += "\n[batching]\n";
  line("micro_batch", integer(s.batching.micro_batch));
  if (s.batching.accumulation_per_epoch.empty()) {
    line("accumulation", integer(s.batching.accumulation));
  } else if (const auto& r = s.batching.accumulation_ramp) {
    line("accumulation", fmt::format("{{ start = {}, step = {}, max = {} }}",
                                     r->start, r->step, r->max));
  } else {
    std::string ks = "[";
    for (int64_t e = 0; e < s.batching.epochs; ++e) {
      if (e) ks += ", ";
      ks += integer(accumulation_at(s.batching, e));
    }
    line("accumulation", ks + "]");
  }
  line("epochs", integer(s.batching.epochs));
  line("ranks", integer(s.batching.ranks));
  line("max_steps", integer(s.batching.max_steps));
  if (s.batching.sampler != Sampler::pad)
    line("sampler",
         toml_string(name_of<Sampler>(kSamplers, s.batching.sampler)));

  const OptimizerSpec& opt = s.optimizer;
  o += "\n[optimizer]\n";
  line("kind", toml_string(name_of<OptimizerKind>(kOptimizers, opt.kind)));
  line("lr", float_text(opt.lr));
  if (opt.kind == OptimizerKind::sgd) {
    line("momentum", float_text(opt.momentum));
  } else {
    line("beta1", float_text(opt.beta1));
    line("beta2", float_text(opt.beta2));
    line("eps", float_text(opt.eps));
  }
  line("weight_decay", float_text(opt.weight_decay));
  line("l2_in_loss", float_text(opt.l2_in_loss));

  const ScheduleSpec& sc = s.schedule;
  o += "\n[schedule]\n";
  line("kind", toml_string(name_of<ScheduleKind>(kSchedules, sc.kind)));
  if (sc.kind == ScheduleKind::linear || sc.kind == ScheduleKind::cosine) {
    if (sc.total_auto && sc.warmup_ratio >= 0)
      line("warmup_ratio", float_text(sc.warmup_ratio));
    else
      line("warmup", integer(sc.warmup));
    line("total", sc.total_auto ? toml_string("auto") : integer(sc.total));
  } else if (sc.kind == ScheduleKind::step) {
    line("step_size", integer(sc.step_size));
    line("gamma", float_text(sc.gamma));
  }
  if (sc.frequency != 1) line("frequency", integer(sc.frequency));

  if (s.clip.enabled) {
    o += "\n[clip]\n";
    line("max_norm", float_text(s.clip.max_norm));
  }

  o += "\n[trainer]\n";
  line("pitfalls", ids(s.trainer.pitfalls));
  line("accepted", ids(s.trainer.accepted));
  line("lr_scaling",
       toml_string(name_of<LrScaling>(kLrScalings, s.trainer.lr_scaling)));

  const PrecisionSpec& pr = s.precision;
  if (pr.grad_buffer != GradBuffer::fp32 || pr.loss_scaling) {
    o += "\n[precision]\n";
    line("grad_buffer",
         toml_string(name_of<GradBuffer>(kGradBuffers, pr.grad_buffer)));
    if (pr.loss_scaling) {
      line("loss_scale", toml_string("dynamic"));
      line("init_scale", float_text(std::ldexp(1.0, int(pr.scale_exp))));
      line("growth_factor", float_text(std::ldexp(1.0, int(pr.growth_exp))));
      line("backoff_factor", float_text(std::ldexp(1.0, int(pr.backoff_exp))));
      line("growth_interval", integer(pr.growth_interval));
      std::string ov = "[";
      for (size_t i = 0; i < pr.overflow.size(); ++i)
        ov += fmt::format("{}[{}, {}]", i ? ", " : "", pr.overflow[i].first,
                          pr.overflow[i].second);
      line("overflow", ov + "]");
    }
  }
  if (s.ema.enabled) {
    o += "\n[ema]\n";
    line("decay", float_text(s.ema.decay));
  }

  o += "\n[expect]\n";
  line("verdict", toml_string(name_of<ExpectKind>(kVerdicts, s.expect.kind)));
  if (s.expect.kind == ExpectKind::diverges_from_reference) {
    line("min_distance", float_text(s.expect.min_distance));
    line("at_step", integer(s.expect.at_step));
  }
  return o;
}

std::string describe(const Scenario& s) {
  std::string model;
  for (size_t i = 0; i < s.model.widths.size(); ++i) {
    if (i) model += '-';
    model += std::to_string(s.model.widths[i]);
  }
  const bool hidden = s.model.widths.size() > 2;
  std::string d = fmt::format(
      "{}({}{},{})", hidden ? "mlp" : "linear", model,
      hidden ? fmt::format(
                   ",{}", name_of<Activation>(kActivations, s.model.activation))
             : std::string(),
      name_of<LossKind>(kLosses, s.model.loss));
  if (s.model.kind == ModelKind::token)
    d = fmt::format("token(vocab={},embed={}) lengths={}[{}..{}]",
                    s.model.vocab, s.model.embed,
                    name_of<SequenceLengths>(kLengths, s.data.lengths),
                    s.data.min_len, s.data.max_len);
  if (s.model.norm != NormKind::none)
    d += fmt::format(" {}", name_of<NormKind>(kNorms, s.model.norm));
  if (s.model.norm == NormKind::groupnorm)
    d += fmt::format("({})", s.model.norm_groups);
  if (s.model.dropout > 0) d += fmt::format(" dropout={}", s.model.dropout);
  d += fmt::format(" n={}", s.data.samples);
  if (s.data.replicate) d += " replicated";
  if (s.data.source == DataSource::csv)
    d += fmt::format(" csv={}", s.data.csv_path);
  else
    d += fmt::format(" seed={}{}", s.data.seed, s.data.dyadic ? " dyadic" : "");
  if (!s.data.shuffle) d += " no-shuffle";
  std::string k = std::to_string(s.batching.accumulation);
  if (k_changes(s.batching)) {
    // K of each epoch, the first 16 of them (10^12 epochs cost nothing).
    constexpr int64_t kShown = 16;
    k.clear();
    for (int64_t e = 0; e < std::min(s.batching.epochs, kShown); ++e)
      k += (e ? "," : "") + std::to_string(accumulation_at(s.batching, e));
    if (s.batching.epochs > kShown) {
      const auto& r = s.batching.accumulation_ramp;
      k += r ? fmt::format(",... (min({}+{}e,{}))", r->start, r->step, r->max)
             : ",...";
    }
  }
  d += fmt::format(" b={} K={} R={}", s.batching.micro_batch, k,
                   s.batching.ranks);
  if (s.batching.sampler != Sampler::pad)
    d += fmt::format(" sampler={}",
                     name_of<Sampler>(kSamplers, s.batching.sampler));
  if (s.batching.epochs != 1) d += fmt::format(" epochs={}", s.batching.epochs);
  if (s.batching.max_steps >= 0)
    d += fmt::format(" max_steps={}", s.batching.max_steps);

  const OptimizerSpec& o = s.optimizer;
  d += fmt::format(" {} lr={}", name_of<OptimizerKind>(kOptimizers, o.kind),
                   o.lr);
  if (o.kind == OptimizerKind::sgd) {
    if (o.momentum != 0) d += fmt::format(" momentum={}", o.momentum);
  } else {
    d += fmt::format(" betas=({},{}) eps={}", o.beta1, o.beta2, o.eps);
  }
  if (o.weight_decay != 0) d += fmt::format(" wd={}", o.weight_decay);
  if (o.l2_in_loss != 0) d += fmt::format(" l2={}", o.l2_in_loss);

  const ScheduleSpec& sc = s.schedule;
  switch (sc.kind) {
    case ScheduleKind::constant:
      break;
    case ScheduleKind::step:
      d += fmt::format(" step(size={},gamma={})", sc.step_size, sc.gamma);
      break;
    case ScheduleKind::linear:
    case ScheduleKind::cosine:
      d += fmt::format(
          " {}(w={},T={})", name_of<ScheduleKind>(kSchedules, sc.kind),
          sc.total_auto && sc.warmup_ratio >= 0
              ? fmt::format("{}*T", sc.warmup_ratio)
              : std::to_string(sc.warmup),
          sc.total_auto ? std::string("auto") : std::to_string(sc.total));
      break;
  }
  if (sc.frequency != 1) d += fmt::format(" every {} steps", sc.frequency);
  if (s.clip.enabled) d += fmt::format(" clip={}", s.clip.max_norm);
  if (s.trainer.lr_scaling != LrScaling::none)
    d += fmt::format(" lr-scaling={}",
                     name_of<LrScaling>(kLrScalings, s.trainer.lr_scaling));
  if (s.precision.grad_buffer != GradBuffer::fp32)
    d += fmt::format(
        " grad={}", name_of<GradBuffer>(kGradBuffers, s.precision.grad_buffer));
  if (s.precision.loss_scaling)
    d += fmt::format(" scaler(2^{},every={})", s.precision.scale_exp,
                     s.precision.growth_interval);
  if (s.ema.enabled) d += fmt::format(" ema={}", s.ema.decay);
  d += fmt::format(" {}", semantics_name(s.trainer.pitfalls));
  if (!s.trainer.accepted.empty())
    d += fmt::format(" accepted={}", semantics_name(s.trainer.accepted));
  return d;
}

}  // namespace accumcheck
