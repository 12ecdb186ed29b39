// The coefficient-engine check of properties/contract_properties.cpp,
// exposed for the tests that break it on purpose.
#pragma once

#include <vector>

#include "properties/harness.hpp"
#include "sim/pitfalls.hpp"

namespace accumcheck::properties {

// The worst relative distance, over the optimizer steps of the oracle run
// of `sem`, between the step's gradient and the coefficient engine's
// weights times independently computed g_j.  break_on_purpose doubles the
// weight of the first term of every step (the check must then fail).
double coefficient_check(const Case& c, const std::vector<Pitfall>& sem,
                         bool break_on_purpose = false);

}  // namespace accumcheck::properties
