// Ops: how layers and optimizers reach a device's kernels, and how a
// user adds an op.
//
// An op is a class template over the device, declared once and
// specialized for each device that implements it, with static functions taking
// the device first, then row-major buffers and element counts:
//
//   template <class D> struct LayerNorm;                                       // ops/layernorm.hpp
//   template <> struct LayerNorm<Host> { static void forward(Host&, ...); ... };  // (same file)
//   template <> struct LayerNorm<Cuda> { static void forward(Cuda&, ...); ... };  // layernorm.cuh
//
// A layer calls ops::LayerNorm<D>::forward(dev, ...) and nothing below it: no Eigen, no host:: or
// cuda:: function. weft's ops, one file each: the .hpp holds the op's template, its formula, its host
// kernels (namespace weft::host) and its Host and Meta specializations; the .cuh beside it its CUDA
// kernels (namespace weft::cuda) and its Cuda specialization:
//
//   gemm           Gemm (cuBLASLt on the GPU)
//   memory         Memory (zero, copy, convert, fill, add), Init (normal draws)
//   gelu, bias     Gelu, Bias
//   layernorm      LayerNorm
//   rmsnorm        RmsNorm (Llama's)
//   attention      Attention (fused qkv in groups of heads sharing a key and value: GPT-2's
//                  multi-head attention is groups of one, Llama's grouped-query attention larger;
//                  causal or bidirectional, padded or not: ops::Mask in mask.hpp)
//   rotary         Rotary (rotary positions, the llama3 scaling; in place on q and k)
//   swiglu         SwiGlu (Llama's gated MLP unit)
//   context_block  ContextBlock (attention over the context axis one block of keys and
//                  values at a time, merged by log-sum-exp: context/attention.hpp's arithmetic)
//   embedding      Embedding (vocab-parallel lookup), Position (learned positions)
//   cross_entropy  CrossEntropy (vocab-parallel)
//   update         Update (AdamW, SGD), Norm (sums of squares for the global norm)
//
// A user's op is written the same way, in the user's own headers
// (tests/ops/op.cpp and examples/03_custom_model.* do), and called the same
// way; nothing in weft is edited. A device without a specialization is a
// compile error at the call (an incomplete type), caught by ImplementedOn where
// a layer wants a clearer message.
//
// Conventions, as in llm.c: activation gradients are written (=), parameter
// gradients accumulate
// (+=) so that micro-batches add up. T is the compute type and acc<T> =
// accumulate_t<T> that of parameter gradients, statistics and master weights
// (core/precision.hpp).
//
// This header is plain C++20.
//
// defines: ops::ImplementedOn
#pragma once

#include <concepts>
#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/trans.hpp"

namespace weft::ops {

using index = std::int64_t;
template <class T> using acc = accumulate_t<T>;

// Whether op F has a specialization for device D visible here.
template <template <class> class F, class D>
concept ImplementedOn = requires { sizeof(F<D>); };

}  // namespace weft::ops
