// ops::Bias on the Cuda device (see bias.hpp for the op's template and the host's).
//
// CUDA kernels: a bias on every row, and its gradient (a column sum).
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Bias (Cuda), cuda::bias_add, cuda::bias_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/columns.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/bias.hpp"

namespace weft::cuda {

// ---- Bias ------------------------------------------------------------------------------------
template <class T>
__global__ void bias_add_kernel(T* y, const T* b, index N, index C) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    y[i] = detail::from_f<T>(detail::to_f(y[i]) + detail::to_f(b[i % C]));
}

// y (N, C) += b (C) on every row.
template <Activation T>
void bias_add(Cuda& d, T* y, const T* b, index N, index C) {
  if (N * C == 0) return;
  bias_add_kernel<<<detail::blocks_for(N * C, 256), 256, 0, d.stream()>>>(detail::dev(y), detail::dev(b), N, C);
  check_launch("bias_add");
}

// db (C) += the sum over rows of dy (N, C).
template <Activation T, Activation G>
void bias_backward(Cuda& d, G* db, const T* dy, index N, index C) {
  column_sum_add(d, db, dy, N, C, "bias_backward");
}

}  // namespace weft::cuda

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
