// ops::Gelu on the Cuda device (see gelu.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/elementwise.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/gelu.hpp"

namespace weft::ops {

template <>
struct Gelu<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, const T* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::gelu_forward(d, out, x, n);
  }

  template <class T>
  static void backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::gelu_backward(d, dx, x, dout, n);
  }
};

}  // namespace weft::ops
