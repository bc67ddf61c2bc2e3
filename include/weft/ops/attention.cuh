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
  // Grouped heads (g > 1) have no kernel yet: refused by name rather than computed wrongly.
  static void check_group(index g) {
    if (g != 1)
      throw Error("ops::Attention<Cuda>", cat("grouped-query attention (", g, " heads per key-value head) has no CUDA kernel yet"),
                  "use as many key-value heads as heads on the GPU, or train on the host");
  }

  template <class T>
  static void forward(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1) {
    check_group(g);
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::attention_forward(d, out, probs, qkv, B, Tn, H, hd);
  }

  template <class T>
  static void backward(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                       index hd, index g = 1) {
    check_group(g);
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::attention_backward(d, dqkv, dout, qkv, probs, B, Tn, H, hd);
  }
};

}  // namespace weft::ops
