// The custom decoder's family (examples/03_custom_model_family.hpp) shipped the way weft ships its
// own: under weft/models/<name>/family.hpp as weft::<name>::Family, so that weft's own weft-train,
// weft-plan and weft-export take it by one word in their CMake list (tests/CMakeLists.txt builds
// them over `custom`; docs/training.md, "Shipping a family").
#pragma once

#include "03_custom_model_family.hpp"

namespace weft::custom {
using Family = ::custom::Family;
}
