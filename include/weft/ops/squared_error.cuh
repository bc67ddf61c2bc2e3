// ops::SquaredError on the Cuda device (see squared_error.hpp for the op and the host's): float and
// bf16 predictions and targets, the math in float, the sum in double.
//
// sum: each block sums its elements' squared differences (CUB block reduction, in double), one
// thread adds the blocks' partial sums in block order: the same bits on every run. backward: an
// elementwise map.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::SquaredError (Cuda), cuda::squared_error_sum, cuda::squared_error_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/squared_error.hpp"

namespace weft::cuda {

template <class T, int Threads>
__global__ void squared_error_partials_kernel(double* partial, const T* pred, const T* target, index n) {
  using Reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  double s = 0;
  for (index i = blockIdx.x * static_cast<index>(Threads) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * Threads) {
    const double d = static_cast<double>(detail::to_f(pred[i])) - static_cast<double>(detail::to_f(target[i]));
    s += d * d;
  }
  s = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <class T>
__global__ void squared_error_backward_kernel(T* dpred, const T* pred, const T* target, index n, float scale) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    dpred[i] = detail::from_f<T>(scale * 2.0f * (detail::to_f(pred[i]) - detail::to_f(target[i])));
}

template <Activation T>
double squared_error_sum(Cuda& d, const T* pred, const T* target, index n) {
  detail::require(n >= 0, "squared_error_sum", cat("n ", n));
  if (n == 0) return 0.0;
  const unsigned blocks = detail::blocks_for(n, 256);
  Allocation partial =
      d.allocate((static_cast<index>(blocks) + 1) * static_cast<index>(sizeof(double)), Category::communication);
  auto* p = static_cast<double*>(partial.data());
  squared_error_partials_kernel<detail::dev_t<T>, 256>
      <<<blocks, 256, 0, d.stream()>>>(p, detail::dev(pred), detail::dev(target), n);
  check_launch("squared_error_sum");
  sum_in_order_kernel<><<<1, 1, 0, d.stream()>>>(p + blocks, p, static_cast<index>(blocks));
  check_launch("squared_error_sum (partials)");
  double r = 0;
  d.to_host(&r, p + blocks, sizeof(double));
  return r;
}

template <Activation T>
void squared_error_backward(Cuda& d, T* dpred, const T* pred, const T* target, index n, float scale) {
  detail::require(n >= 0, "squared_error_backward", cat("n ", n));
  if (n == 0) return;
  squared_error_backward_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(
      detail::dev(dpred), detail::dev(pred), detail::dev(target), n, scale);
  check_launch("squared_error_backward");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct SquaredError<Cuda> {
  template <class T>
  static double sum(Cuda& d, const T* pred, const T* target, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    return cuda::squared_error_sum(d, pred, target, n);
  }
  template <class T>
  static void backward(Cuda& d, T* dpred, const T* pred, const T* target, index n, acc<T> scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::squared_error_backward(d, dpred, pred, target, n, static_cast<float>(scale));
  }
};

}  // namespace weft::ops
