// The host GEMM's Eigen instantiations, compiled here once for a build that defines
// WEFT_HOST_GEMM_COMPILED=1 (device/host/gemm.hpp says why). Include it in exactly one unit of such
// a build (CMake's weft::host_gemm is that unit); with the definition and without this unit, the
// link fails naming weft::host::eigen_gemm.
#pragma once

#include "weft/device/host/gemm.hpp"

WEFT_HOST_GEMM_INSTANCES()
