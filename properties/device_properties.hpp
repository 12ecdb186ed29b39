// The device tier of the property battery (properties/device_properties.cpp).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "gpu/emulated.hpp"
#include "properties/harness.hpp"

namespace accumcheck::properties {
const std::vector<Property>& device_properties();

// "device" for the emulated executor, "cuda" for the CUDA executor: the
// suffix of a device property's name ("equivalence.device",
// "equivalence.cuda": the same property, the same kernel bodies).
template <class Dev>
std::string engine_name() {
  return std::is_same_v<Dev, EmulatedDevice> ? "device" : "cuda";
}
}  // namespace accumcheck::properties
