// Ops<Device>: the one dispatch point from layers and optimizers to a device's kernels.
//
// Layers (nn/) and the data-parallel step (optim/) call Ops<D>::name(dev, ...) and nothing below it:
// no Eigen, no host:: or cuda:: function. Each device specializes Ops with the same operation
// signatures (device first, then row-major buffers and element counts), in its own folder:
// device/host/dispatch.hpp for Host; the Cuda side follows the same list. device/dispatch.hpp
// includes every specialization this build has.
//
// Conventions, as in llm.c: activation gradients are written (=), parameter gradients accumulate
// (+=) so that micro-batches add up.
//
// This header is plain C++20.
#pragma once

namespace weft {

// Whether a GEMM operand is used transposed.
enum class Trans : bool { no = false, yes = true };

template <class D>
struct Ops;  // specialized per device

}  // namespace weft
