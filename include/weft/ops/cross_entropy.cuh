// ops::CrossEntropy on the Cuda device (see cross_entropy.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/cross_entropy.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/cross_entropy.hpp"

namespace weft::ops {

template <>
struct CrossEntropy<Cuda> {
  template <class T>
  static void row_max(Cuda& d, acc<T>* rowmax, const T* logits, index N, index V, index valid) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::ce_row_max(d, rowmax, logits, N, V, valid);
  }

  template <class T>
  static void row_stats(Cuda& d, acc<T>* stats, const T* logits, const acc<T>* rowmax, const std::int32_t* targets,
                        index N, index V, index valid, index begin) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::ce_row_stats(d, stats, logits, rowmax, targets, N, V, valid, begin);
  }

  static double loss(Cuda& d, float* sumexp, const float* stats, const float* rowmax, index N) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    return cuda::ce_loss(d, sumexp, stats, rowmax, N);
  }

  template <class T>
  static void backward(Cuda& d, T* dlogits, const T* logits, const acc<T>* rowmax, const acc<T>* sumexp,
                       const std::int32_t* targets, index N, index V, index valid, index begin, acc<T> scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (dlogits != logits)
      throw Error("ops::CrossEntropy<Cuda>::backward", "the gradient must overwrite the logits",
                  "pass the logits buffer twice");
    cuda::ce_backward(d, dlogits, rowmax, sumexp, targets, N, V, valid, begin, scale, 1);
  }
};

}  // namespace weft::ops
