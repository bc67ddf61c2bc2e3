// weft's ops that nn/ and optim/ reach (ops/op.hpp), each with its host and Meta
// specializations in its own file. The Cuda device's join in .cu translation units through
// ops/all.cuh. Llama's (rmsnorm, rotary, swiglu) and the context block's are included by the
// layers that call them.
//
// defines: (includes weft's ops that nn/ and optim/ reach)
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
