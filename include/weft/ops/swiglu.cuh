// ops::SwiGlu on the Cuda device (see swiglu.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include "weft/device/cuda/kernels/llama.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/swiglu.hpp"

namespace weft::ops {

template <>
struct SwiGlu<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* y, const T* a, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::swiglu_forward(d, y, a, n);
  }
  template <class T>
  static void backward(Cuda& d, T* da, const T* a, const T* dy, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::swiglu_backward(d, da, a, dy, n);
  }
};

}  // namespace weft::ops
