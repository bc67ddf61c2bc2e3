// ops::Attention on the Cuda device (see attention.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>

#include "weft/core/error.hpp"
#include "weft/device/cuda/kernels/attention.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/attention.hpp"

namespace weft::ops {

template <>
struct Attention<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::attention_forward(d, out, probs, qkv, B, Tn, H, hd, g);
  }

  template <class T>
  static void backward(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                       index hd, index g = 1) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::attention_backward(d, dqkv, dout, qkv, probs, B, Tn, H, hd, g);
  }
};

}  // namespace weft::ops
