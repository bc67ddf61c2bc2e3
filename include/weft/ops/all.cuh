// The Cuda device's ops (ops/*.cuh, beside each op's host specialization): T is the
// compute type (float or bf16) and acc<T> = float the type of parameter gradients, statistics and
// master weights. Every layer, the data-parallel protocol and the trainer reach the GPU through
// these and nothing else.
//
// GEMMs go through cuBLASLt (device/cuda/gemm.cuh) with one handle and workspace per device, made
// on first use; everything else through the kernels of device/cuda/. Calls are queued on the
// device's stream; the ones that return a number to the host (the loss sum, the sum of squares)
// wait for it.
//
// Include only from .cu translation units; a host-only build never sees this header.
//
// defines: (includes every op's Cuda specialization)
#pragma once

#include "weft/ops/all.hpp"
#include "weft/ops/attention.cuh"
#include "weft/ops/bias.cuh"
#include "weft/ops/context_block.cuh"
#include "weft/ops/cross_entropy.cuh"
#include "weft/ops/embedding.cuh"
#include "weft/ops/gelu.cuh"
#include "weft/ops/gemm.cuh"
#include "weft/ops/layernorm.cuh"
#include "weft/ops/memory.cuh"
#include "weft/ops/modulate.cuh"
#include "weft/ops/moe.cuh"
#include "weft/ops/rmsnorm.cuh"
#include "weft/ops/rotary.cuh"
#include "weft/ops/scaled_gemm.cuh"
#include "weft/ops/silu.cuh"
#include "weft/ops/squared_error.cuh"
#include "weft/ops/swiglu.cuh"
#include "weft/ops/update.cuh"
