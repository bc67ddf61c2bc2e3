// Every device's Ops specialization that this build has (device/ops.hpp): what nn/ and optim/
// include to reach kernels. The host's always; the Cuda device's joins here with the layers on the
// GPU.
#pragma once

#include "weft/device/host/dispatch.hpp"
