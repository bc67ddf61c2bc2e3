// ops::Embedding and ops::Position on the Cuda device (see embedding.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/embedding.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/embedding.hpp"

namespace weft::ops {

template <>
struct Embedding<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, const std::int32_t* tokens, const T* table, index N, index C, index begin,
                      index end) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::embedding_forward(d, out, tokens, table, N, C, begin, end);
  }

  template <class T>
  static void backward(Cuda& d, acc<T>* dtable, const T* dout, const std::int32_t* tokens, index N, index C,
                       index begin, index end) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::embedding_backward(d, dtable, dout, tokens, N, C, begin, end);
  }
};

template <>
struct Position<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* x, const T* table, index B, index Tl, index C, Positions pos) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::position_forward(d, x, table, B, Tl, C, pos);
  }

  template <class T>
  static void backward(Cuda& d, acc<T>* dtable, const T* dy, index B, index Tl, index C, Positions pos) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::position_backward(d, dtable, dy, B, Tl, C, pos);
  }
};

}  // namespace weft::ops
