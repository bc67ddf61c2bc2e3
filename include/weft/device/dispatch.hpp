// Every op family's host specialization (ops/family.hpp): what nn/ and optim/ include to reach
// kernels. The Cuda device's specializations join in .cu translation units through
// device/cuda/dispatch.cuh.
#pragma once

#include "weft/ops/attention.hpp"
#include "weft/ops/bias.hpp"
#include "weft/ops/cross_entropy.hpp"
#include "weft/ops/embedding.hpp"
#include "weft/ops/gelu.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/ops/layernorm.hpp"
#include "weft/ops/memory.hpp"
#include "weft/ops/update.hpp"
