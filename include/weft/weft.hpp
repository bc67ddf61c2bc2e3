// weft: everything. The host build always; with WEFT_ENABLE_CUDA (defined by the weft::cuda target)
// the Cuda device too, and in CUDA translation units (nvcc) the ops' Cuda specializations
// (ops/*.cuh: the CUDA kernels, attention and cuBLASLt GEMMs), thread ranks sharing a GPU, and the NCCL communicator.
#pragma once

#include "weft/weft_host.hpp"

#if defined(WEFT_ENABLE_CUDA)
#include "weft/device/cuda/device.hpp"
#if defined(__CUDACC__)
#include "weft/comm/gpu/thread_memory.cuh"
#include "weft/comm/nccl/nccl_comm.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/all.cuh"
#endif
#endif
