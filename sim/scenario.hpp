// Scenario: the validated, engine-agnostic description of one experiment.
//
// A scenario file (TOML, see docs/scenario-format.md) parses into this
// struct; every engine and every run mode reads only this.  All
// hyperparameters are held as the double the file spells; engines round
// them to their own precision exactly as PyTorch would (float32 engines
// round once, the oracle takes the double exactly).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/pitfalls.hpp"

namespace accumcheck {

enum class Activation { identity, tanh, relu, gelu };
enum class LossKind { mse, cross_entropy };
// kind = "mlp": the MLP of `widths`; kind = "token": embedding [vocab x
// embed] -> Linear(embed, vocab) -> per-token softmax cross-entropy.
enum class ModelKind { mlp, token };
// Normalization after each hidden Linear, before its activation.
// groupnorm: nn.GroupNorm(norm_groups, width), per-sample statistics over
// each group of width / norm_groups consecutive features (layernorm is
// the one-group case).
enum class NormKind { none, batchnorm, layernorm, groupnorm };

struct ModelSpec {
  // Layer widths from input to output: {d_in, h1, ..., d_out}. Two entries
  // is linear regression; every hidden layer applies `activation`.
  std::vector<int64_t> widths;
  Activation activation = Activation::tanh;
  LossKind loss = LossKind::mse;
  ModelKind kind = ModelKind::mlp;
  NormKind norm = NormKind::none;  // mlp only
  int64_t norm_groups = 1;         // groupnorm: groups per hidden layer
  double dropout = 0.0;  // mlp: p of nn.Dropout after each hidden activation
  // token: widths = {embed, vocab}; vocab and embed repeat them.
  int64_t vocab = 0, embed = 0;
  int64_t d_in() const { return widths.front(); }
  int64_t d_out() const { return widths.back(); }
};

enum class DataSource { generated, csv };
// fixed: every sequence max_len; uniform: uniform in [min_len, max_len];
// long-tailed: Pareto(1) from min_len, P(len >= x) = min_len / x, clamped
// to max_len.
enum class SequenceLengths { fixed, uniform, long_tailed };

struct DataSpec {
  DataSource source = DataSource::generated;
  int64_t samples = 0;   // dataset size n
  bool dyadic = false;   // generated values n/2^k: every product exact
  std::string csv_path;  // absolute, resolved against the scenario file
  uint64_t seed = 0;     // the scenario seed (data, init, shuffles, masks)
  bool shuffle = true;   // seeded shuffle per epoch
  // Every micro-batch the same multiset of samples: generated sample i
  // takes sample (i mod micro_batch)'s values (needs shuffle = false).
  bool replicate = false;
  // certify: whether a trainer must draw the micro-batches in exactly the
  // plan's order (true), or may draw its own order -- its own DataLoader,
  // sampler, shuffle -- as long as each epoch covers every sample once
  // (false, the default).
  bool pinned_order = false;
  // Token models: sequence lengths (loss-bearing tokens), per sample id.
  SequenceLengths lengths = SequenceLengths::fixed;
  int64_t min_len = 1, max_len = 1;
};

// How the epoch's order is split over R ranks.
//   pad        DistributedSampler(drop_last=False): padded by repeating the
//              first samples to a multiple of R, rank r takes every R-th id
//   drop-last  DistributedSampler(drop_last=True): the tail that does not
//              fill R ranks is dropped
//   split      order[r::R] with no padding (a hand-written sharder): ranks
//              hold unequal shards when R does not divide n
enum class Sampler { pad, drop_last, split };

struct BatchingSpec {
  int64_t micro_batch = 1;   // b
  int64_t accumulation = 1;  // K (of epoch 0 when K changes)
  // K per epoch when it changes during training (seed 002's cold start,
  // GPT-3's batch ramp): one entry per epoch, all >= 1; empty: K in every
  // epoch.  sim/k_schedule.hpp reads it.
  std::vector<int64_t> accumulation_per_epoch;
  // The ramp rule it came from, when the file gave one: K_e = min(start +
  // e * step, max).  Written back as the rule (scenario_write.cpp), never as
  // one entry per epoch: 10^12 epochs must cost nothing to describe.
  struct Ramp {
    int64_t start = 1, step = 0, max = 1;
  };
  std::optional<Ramp> accumulation_ramp;
  int64_t epochs = 1;
  int64_t ranks = 1;  // R data-parallel ranks (DistributedSampler sharding)
  Sampler sampler = Sampler::pad;
  int64_t max_steps = -1;  // stop after this many optimizer steps (-1: all)
};

enum class OptimizerKind { sgd, adam, adamw };

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.1;
  double momentum = 0.0;                          // SGD only
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  double weight_decay = 0.0;  // coupled (SGD, Adam) or decoupled (AdamW)
  double l2_in_loss = 0.0;    // lambda: loss += lambda*|theta|^2/2
};

enum class LrScaling { none, linear, sqrt };

enum class ScheduleKind { constant, step, linear, cosine };

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::constant;
  int64_t warmup = 0;  // linear, cosine: warmup steps
  int64_t total = 0;   // linear, cosine: horizon in scheduler steps
  // total = "auto": the horizon is the run's optimizer steps, as a trainer
  // computes it from the data loader and K (sim/k_schedule.hpp); then
  // warmup_ratio >= 0 sets warmup = ceil(total * warmup_ratio)
  // (Transformers' get_warmup_steps).
  bool total_auto = false;
  double warmup_ratio = -1;
  int64_t step_size = 1;  // step: decay every step_size scheduler steps
  double gamma = 0.1;     // step: decay factor
  // scheduler.step() after every `frequency`-th optimizer step, counted
  // across epochs (Lightning's lr_scheduler config {"interval": "step",
  // "frequency": f}); 1: after every step.
  int64_t frequency = 1;
  // A declared table (the contract tier: a scheduler the recorder stepped
  // itself, verify/trace schedule.csv): S(n) = (*table)[n], whatever
  // `kind` says; past its end S is NaN (no lr the schedule can give).
  // `stretched_table`: the same schedule rebuilt with every length K
  // times longer (schedule-horizon-in-micro-steps), null where the
  // declaration could not rebuild it.
  std::shared_ptr<const std::vector<double>> table, stretched_table;
};

struct ClipSpec {
  bool enabled = false;
  double max_norm = 1.0;
};

// How the scenario's trainer deviates from `correct`; the accepted
// semantics is what certification and [expect] judge against.
struct TrainerSpec {
  std::vector<Pitfall> pitfalls;  // empty: the `correct` trainer
  std::vector<Pitfall> accepted;  // empty: `correct` is accepted
  // The lr-scaling lesson (seeds 001, 003, 002): the trainer's lr is the
  // scenario's lr times 1, K or sqrt(K).
  LrScaling lr_scaling = LrScaling::none;
};

// The precision of the gradient buffers (.grad) the micro-batches
// accumulate in; parameters, activations and optimizer state stay float32
// (master weights).  Each backward's fresh float32 gradient is rounded to
// the buffer's format (round to nearest even) and added in float32, the
// sum rounded back: grad = rnd(grad + rnd(fresh)), as PyTorch adds bf16
// and fp16 tensors (through float).  The oracle keeps exact sums; the
// error model (oracle/error_model.hpp) bounds the difference.
enum class GradBuffer { fp32, bf16, fp16 };

// [precision]: the gradient buffer and dynamic loss scaling as PyTorch's
// GradScaler does it.  The scale is a power of two, 2^scale_exp, so that
// scaling and unscaling are exact in every engine (and the loss weight
// stays an exact rational: sim/engine.hpp LossWeight).
struct PrecisionSpec {
  GradBuffer grad_buffer = GradBuffer::fp32;
  bool loss_scaling = false;       // loss_scale = "dynamic"
  int64_t scale_exp = 16;          // init_scale = 65536 (GradScaler's default)
  int64_t growth_exp = 1;          // growth_factor = 2
  int64_t backoff_exp = -1;        // backoff_factor = 0.5
  int64_t growth_interval = 2000;  // clean steps before the scale grows
  // Overflow injected deterministically: (window, micro-step) pairs, both
  // from 0 (windows counted over the whole run): that micro-step's
  // backward overflows, so the window's gradient holds an inf until the
  // next zero_grad.
  std::vector<std::pair<int64_t, int64_t>> overflow;
};

// [ema]: the trainer keeps an exponential moving average of the
// parameters (torch.optim.swa_utils.AveragedModel with an EMA avg_fn):
// after each optimizer step ema = ema * decay + p * (1 - decay); it starts
// as a copy of the initial parameters.
struct EmaSpec {
  bool enabled = false;
  double decay = 0.999;
};

enum class ExpectKind {
  matches_reference,        // the trainer stays within tolerance of the
                            // large-batch reference at every window boundary
  diverges_from_reference,  // it leaves the reference by > min_distance
  never_steps,              // it performs no optimizer step at all
  matches_accepted,  // it stays within tolerance of the accepted semantics
};

struct ExpectSpec {
  ExpectKind kind = ExpectKind::matches_reference;
  // diverges: the relative parameter distance to the reference must
  // exceed this at step `at_step` (or at the last step if -1).
  double min_distance = 0.0;
  int64_t at_step = -1;
};

struct Scenario {
  std::string name;    // file stem
  std::string path;    // the file it came from
  std::string story;   // one line for `accumcheck list`
  std::string digest;  // hex FNV-1a 64 of the file bytes
  ModelSpec model;
  DataSpec data;
  BatchingSpec batching;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  ClipSpec clip;
  TrainerSpec trainer;
  PrecisionSpec precision;
  EmaSpec ema;
  ExpectSpec expect;
  // Where the keys checked after parsing were written in `path`: line and
  // column by key ("batching.epochs"), for the scenario-wide limits that
  // wait for a command's overrides (sim/limits.hpp
  // require_scenario_within_limits).  A key not written is absent.
  std::map<std::string, std::pair<int64_t, int64_t>, std::less<>> written_at;
};

// One-line self-description, enough to rerun the case:
// "mlp(4-8-3,tanh,mse) n=20 b=3 K=4 adam lr=0.001 zero-grad-never".
std::string describe(const Scenario& s);

}  // namespace accumcheck
