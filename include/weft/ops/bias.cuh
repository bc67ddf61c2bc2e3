// ops::Bias on the Cuda device (see bias.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/bias.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/bias.hpp"

namespace weft::ops {

template <>
struct Bias<Cuda> {
  template <class T>
  static void add(Cuda& d, T* y, const T* b, index N, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::bias_add(d, y, b, N, C);
  }

  template <class T>
  static void backward(Cuda& d, acc<T>* db, const T* dy, index N, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::bias_backward(d, db, dy, N, C);
  }
};

}  // namespace weft::ops
