// ops::RmsNorm on the Cuda device (see rmsnorm.hpp for the op's template and the host's).
//
// CUDA kernels: statistics and sums in float, each in a fixed order (warp sums, one thread per
// column for the weight's gradient): the same bits in every run.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::RmsNorm (Cuda), cuda::rmsnorm_forward, cuda::rmsnorm_backward
#pragma once

#include <cmath>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/rmsnorm.hpp"

namespace weft::cuda {

// ---- RMSNorm: one warp per row ------------------------------------------------------------------
template <class T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, index N, index C, float eps) {
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + row * C;
  float s = 0;
  for (index c = lane; c < C; c += 32) {
    const float v = detail::to_f(xr[c]);
    s += v * v;
  }
  const float r = rsqrtf(detail::warp_sum(s) / static_cast<float>(C) + eps);
  for (index c = lane; c < C; c += 32) y[row * C + c] = detail::from_f<T>(detail::to_f(xr[c]) * r * detail::to_f(w[c]));
  if (lane == 0) rstd[row] = r;
}

template <class T>
__global__ void rmsnorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, index N,
                                           index C, const T* dresid) {
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float r = rstd[row];
  float s = 0;
  for (index c = lane; c < C; c += 32)
    s += detail::to_f(x[row * C + c]) * r * detail::to_f(w[c]) * detail::to_f(dy[row * C + c]);
  const float m = detail::warp_sum(s) / static_cast<float>(C);
  for (index c = lane; c < C; c += 32) {
    float g = r * (detail::to_f(w[c]) * detail::to_f(dy[row * C + c]) - detail::to_f(x[row * C + c]) * r * m);
    if (dresid) g += detail::to_f(dresid[row * C + c]);
    dx[row * C + c] = detail::from_f<T>(g);
  }
}

// dw[c] += sum over rows of x rstd dy, one thread per column, rows in order.
template <class T, class G>
__global__ void rmsnorm_backward_dw_kernel(G* dw, const T* dy, const T* x, const float* rstd, index N, index C) {
  for (index c = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<index>(gridDim.x) * blockDim.x) {
    float s = 0;
    for (index n = 0; n < N; ++n) s += detail::to_f(x[n * C + c]) * rstd[n] * detail::to_f(dy[n * C + c]);
    dw[c] = detail::from_f<G>(detail::to_f(dw[c]) + s);
  }
}

template <Activation T>
void rmsnorm_forward(Cuda& d, T* y, float* rstd, const T* x, const T* w, index N, index C, float eps) {
  detail::require(C > 0 && N >= 0, "rmsnorm_forward", cat("N ", N, ", C ", C));
  if (N == 0) return;
  constexpr unsigned threads = 256, rows = threads / 32;
  rmsnorm_forward_kernel<<<static_cast<unsigned>((N + rows - 1) / rows), threads, 0, d.stream()>>>(
      detail::dev(y), rstd, detail::dev(x), detail::dev(w), N, C, eps);
  check_launch("rmsnorm_forward");
}

template <Activation T, Activation G>
void rmsnorm_backward(Cuda& d, T* dx, G* dw, const T* dy, const T* x, const T* w, const float* rstd, index N, index C,
                      const T* dresid = nullptr) {
  detail::require(C > 0 && N >= 0, "rmsnorm_backward", cat("N ", N, ", C ", C));
  if (N == 0) return;
  constexpr unsigned threads = 256, rows = threads / 32;
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>((N + rows - 1) / rows), threads, 0, d.stream()>>>(
      detail::dev(dx), detail::dev(dy), detail::dev(x), detail::dev(w), rstd, N, C, detail::dev(dresid));
  check_launch("rmsnorm_backward (dx)");
  rmsnorm_backward_dw_kernel<<<detail::blocks_for(C, 256), 256, 0, d.stream()>>>(detail::dev(dw), detail::dev(dy),
                                                                                 detail::dev(x), rstd, N, C);
  check_launch("rmsnorm_backward (dw)");
}

}  // namespace weft::cuda

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
