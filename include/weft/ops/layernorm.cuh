// ops::LayerNorm on the Cuda device (see layernorm.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/layernorm.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/layernorm.hpp"

namespace weft::ops {

template <>
struct LayerNorm<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, acc<T>* mean, acc<T>* rstd, const T* x, const T* w, const T* b, index N, index C,
                      acc<T> eps) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::layernorm_forward(d, out, mean, rstd, x, w, b, N, C, eps);
  }

  template <class T>
  static void backward(Cuda& d, T* dx, acc<T>* dw, acc<T>* db, const T* dout, const T* x, const T* w,
                       const acc<T>* mean, const acc<T>* rstd, index N, index C, const T* dresid = nullptr) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::layernorm_backward(d, dx, dw, db, dout, x, w, mean, rstd, N, C, dresid);
  }
};

}  // namespace weft::ops
