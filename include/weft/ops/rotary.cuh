// ops::Rotary on the Cuda device (see rotary.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include "weft/device/cuda/kernels/llama.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/rotary.hpp"

namespace weft::ops {

template <>
struct Rotary<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* qkv, index B, index Tn, index G, index g, index hd, const Rope& r, Positions pos = {}) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::rotary(d, qkv, B, Tn, G, g, hd, r, pos, 1.0);
  }
  template <class T>
  static void backward(Cuda& d, T* dqkv, index B, index Tn, index G, index g, index hd, const Rope& r, Positions pos = {}) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::rotary(d, dqkv, B, Tn, G, g, hd, r, pos, -1.0);
  }
};

}  // namespace weft::ops
