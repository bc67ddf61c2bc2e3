// ops::RmsNorm on the Cuda device (see rmsnorm.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include "weft/device/cuda/kernels/llama.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/rmsnorm.hpp"

namespace weft::ops {

template <>
struct RmsNorm<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* y, acc<T>* rstd, const T* x, const T* w, index N, index C, acc<T> eps) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::rmsnorm_forward(d, y, rstd, x, w, N, C, eps);
  }
  template <class T>
  static void backward(Cuda& d, T* dx, acc<T>* dw, const T* dy, const T* x, const T* w, const acc<T>* rstd, index N,
                       index C, const T* dresid = nullptr) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::rmsnorm_backward(d, dx, dw, dy, x, w, rstd, N, C, dresid);
  }
};

}  // namespace weft::ops
