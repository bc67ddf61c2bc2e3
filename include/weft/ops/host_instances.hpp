// The host kernels' instantiations (every op's Host entry points for float, double and bf16),
// compiled here once for a build that defines WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp
// says why). Include it in exactly one unit of such a build (CMake's weft::host_kernels is that
// unit, compiled optimized whatever the build type); with the definition and without this unit, the
// link fails naming the op. A build may compile them in three units side by side instead: each
// defines WEFT_HOST_KERNELS_TYPE (float, double or weft::bf16) for that type's instances, and one of
// them WEFT_HOST_KERNELS_PAIRS=1 for those of the other type pairs.
#pragma once

#include "weft/ops/attention.hpp"
#include "weft/ops/bias.hpp"
#include "weft/ops/context_block.hpp"
#include "weft/ops/cross_entropy.hpp"
#include "weft/ops/embedding.hpp"
#include "weft/ops/gelu.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/ops/layernorm.hpp"
#include "weft/ops/memory.hpp"
#include "weft/ops/modulate.hpp"
#include "weft/ops/moe.hpp"
#include "weft/ops/rmsnorm.hpp"
#include "weft/ops/rotary.hpp"
#include "weft/ops/scaled_gemm.hpp"
#include "weft/ops/silu.hpp"
#include "weft/ops/squared_error.hpp"
#include "weft/ops/swiglu.hpp"
#include "weft/ops/update.hpp"

#ifdef WEFT_HOST_KERNELS_TYPE
#define WEFT_HOST_KERNELS_HERE(INSTANCES) INSTANCES(, WEFT_HOST_KERNELS_TYPE)
#else
#define WEFT_HOST_KERNELS_HERE(INSTANCES) WEFT_HOST_KERNELS_DEFINE(INSTANCES)
#endif
WEFT_HOST_KERNELS_HERE(WEFT_HOST_ATTENTION_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_BIAS_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_CONTEXT_BLOCK_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_CROSS_ENTROPY_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_EMBEDDING_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_GELU_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_GEMM_OP_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_LAYERNORM_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_MEMORY_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_MODULATE_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_MOE_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_RMSNORM_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_ROTARY_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_SILU_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_SQUARED_ERROR_INSTANCES)
WEFT_HOST_KERNELS_HERE(WEFT_HOST_SWIGLU_INSTANCES)

#if !defined(WEFT_HOST_KERNELS_TYPE) || (defined(WEFT_HOST_KERNELS_PAIRS) && WEFT_HOST_KERNELS_PAIRS)
WEFT_HOST_CONTEXT_BLOCK_PAIRS()
WEFT_HOST_CROSS_ENTROPY_PAIRS()
WEFT_HOST_GEMM_OP_PAIRS()
WEFT_HOST_MEMORY_PAIRS()
WEFT_HOST_MOE_PAIRS()
WEFT_HOST_UPDATE_PAIRS()
WEFT_HOST_SCALED_GEMM_PAIRS()
#endif
