// Internal to the scenario parser and writer (sim/scenario_parse.cpp,
// sim/scenario_write.cpp): the names of every enumerated setting, spelled
// as in scenario files, and the TOML spelling of strings and floats.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "sim/scenario.hpp"

namespace accumcheck::scenario_text {

inline constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();

template <class E>
using Names = std::span<const std::pair<std::string_view, E>>;

inline constexpr std::pair<std::string_view, Activation> kActivations[] = {
    {"tanh", Activation::tanh},
    {"relu", Activation::relu},
    {"gelu", Activation::gelu},
    {"identity", Activation::identity}};
inline constexpr std::pair<std::string_view, LossKind> kLosses[] = {
    {"mse", LossKind::mse}, {"cross-entropy", LossKind::cross_entropy}};
inline constexpr std::pair<std::string_view, ModelKind> kModelKinds[] = {
    {"mlp", ModelKind::mlp}, {"token", ModelKind::token}};
inline constexpr std::pair<std::string_view, NormKind> kNorms[] = {
    {"none", NormKind::none},
    {"batchnorm", NormKind::batchnorm},
    {"layernorm", NormKind::layernorm},
    {"groupnorm", NormKind::groupnorm}};
inline constexpr std::pair<std::string_view, SequenceLengths> kLengths[] = {
    {"fixed", SequenceLengths::fixed},
    {"uniform", SequenceLengths::uniform},
    {"long-tailed", SequenceLengths::long_tailed}};
inline constexpr std::pair<std::string_view, OptimizerKind> kOptimizers[] = {
    {"sgd", OptimizerKind::sgd},
    {"adam", OptimizerKind::adam},
    {"adamw", OptimizerKind::adamw}};
inline constexpr std::pair<std::string_view, ScheduleKind> kSchedules[] = {
    {"constant", ScheduleKind::constant},
    {"step", ScheduleKind::step},
    {"linear", ScheduleKind::linear},
    {"cosine", ScheduleKind::cosine}};
inline constexpr std::pair<std::string_view, Sampler> kSamplers[] = {
    {"pad", Sampler::pad},
    {"drop-last", Sampler::drop_last},
    {"split", Sampler::split}};
inline constexpr std::pair<std::string_view, LrScaling> kLrScalings[] = {
    {"none", LrScaling::none},
    {"linear", LrScaling::linear},
    {"sqrt", LrScaling::sqrt}};
inline constexpr std::pair<std::string_view, GradBuffer> kGradBuffers[] = {
    {"fp32", GradBuffer::fp32},
    {"bf16", GradBuffer::bf16},
    {"fp16", GradBuffer::fp16}};
inline constexpr std::pair<std::string_view, ExpectKind> kVerdicts[] = {
    {"matches-reference", ExpectKind::matches_reference},
    {"diverges-from-reference", ExpectKind::diverges_from_reference},
    {"never-steps", ExpectKind::never_steps},
    {"matches-accepted", ExpectKind::matches_accepted}};

template <class E>
std::string_view name_of(Names<E> names, E value) {
  for (const auto& [n, v] : names)
    if (v == value) return n;
  return "?";
}

// A TOML basic string: quoted, with escapes.
std::string toml_string(std::string_view s);

// Shortest round-trip text of a double, always spelled as a TOML float.
std::string float_text(double x);

}  // namespace accumcheck::scenario_text
