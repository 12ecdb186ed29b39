// The device tier of the property battery (properties/device_properties.cpp).
#pragma once

#include <vector>

#include "properties/harness.hpp"

namespace accumcheck::properties {
const std::vector<Property>& device_properties();
}  // namespace accumcheck::properties
