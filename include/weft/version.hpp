#pragma once

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0

namespace weft {
inline constexpr const char* version = "0.1.0";
}
