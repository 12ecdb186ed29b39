// Internal to the scenario parser: [precision] and [ema]
// (sim/scenario_parse_precision.cpp).
#pragma once

#include "sim/scenario.hpp"
#include "sim/scenario_section.hpp"

namespace accumcheck::scenario_section {

void parse_precision(const Parser& p, const Section& precision,
                     const Section& ema, Scenario& s);

}  // namespace accumcheck::scenario_section
