// weft: everything. Today this is the host build; the CUDA back end joins here (behind
// WEFT_ENABLE_CUDA) when it lands.
#pragma once

#include "weft/weft_host.hpp"
