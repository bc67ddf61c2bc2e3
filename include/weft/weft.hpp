// weft: everything. The host build always; with WEFT_ENABLE_CUDA (defined by the weft::cuda target)
// the Cuda device too, and in CUDA translation units (nvcc) the CUDA op set and cuBLASLt GEMMs.
#pragma once

#include "weft/weft_host.hpp"

#if defined(WEFT_ENABLE_CUDA)
#include "weft/device/cuda/device.hpp"
#if defined(__CUDACC__)
#include "weft/device/cuda/gemm.cuh"
#include "weft/device/cuda/ops.cuh"
#endif
#endif
