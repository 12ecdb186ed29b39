// Traces for the certify tests: `accumcheck run --engine device` runs of
// scenarios/certify-mlp.toml, written as the trace of that one run.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/emulated.hpp"
#include "sim/data.hpp"
#include "sim/experiment.hpp"
#include "sim/layout.hpp"
#include "sim/scenario_parse.hpp"
#include "tests/source_dir.hpp"
#include "verify/export/export.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck::certify_test {

namespace fs = std::filesystem;

inline const std::string kScenario =
    ::accumcheck::testing_util::source_dir() + "/scenarios/certify-mlp.toml";

inline std::string temp_dir(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "accumcheck_certify_test/" + name;
  fs::remove_all(d);
  fs::create_directories(fs::path(d).parent_path());
  return d;
}

// The device engine's trainer run of `run`, written as a trace of `as`
// (its name and digest): `as` is `run` itself, or the scenario a trainer
// was handed when it ran something else (its own K, say).
inline std::string device_trace_as(const Scenario& run, const Scenario& as,
                                   const std::string& name) {
  const Dataset data = make_dataset(run);
  const ParamLayout layout = layout_of(run.model);
  const std::vector<float> init = initial_parameters(run, layout);
  EmulatedExecutor exec;
  const auto x = run_experiment(run, [&] {
    return std::make_unique<Device<EmulatedExecutor>>(run.model, data, init,
                                                      exec);
  });
  TraceWriter w(as.name, as.digest, "device-emulated", "float32");
  add_run(w, x.trainer, layout);
  const std::string dir = temp_dir(name);
  write_trace(dir, w);
  return dir;
}

// The device engine's trainer run of `s` (with `pitfalls`), as a trace of
// that one run, the way `accumcheck run --engine device` writes it.
inline std::string device_trace(const std::string& name,
                                const std::vector<Pitfall>& pitfalls,
                                const std::string& file = kScenario) {
  Scenario s = parse_scenario_file(file);
  s.trainer.pitfalls = pitfalls;
  return device_trace_as(s, s, name);
}

inline const Scenario& scenario() {
  static const Scenario s = parse_scenario_file(kScenario);
  return s;
}

}  // namespace accumcheck::certify_test
