// ops::SwiGlu on the Cuda device (see swiglu.hpp for the op's template and the host's).
//
// CUDA kernels: one thread per output element.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::SwiGlu (Cuda), cuda::swiglu_forward, cuda::swiglu_backward
#pragma once

#include <cmath>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/swiglu.hpp"

namespace weft::cuda {

// ---- SwiGLU: one thread per output element ----------------------------------------------------------
template <class T>
__global__ void swiglu_forward_kernel(T* y, const T* a, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const float g = detail::to_f(a[2 * i]), u = detail::to_f(a[2 * i + 1]);
    y[i] = detail::from_f<T>(g / (1.0f + expf(-g)) * u);
  }
}
template <class T>
__global__ void swiglu_backward_kernel(T* da, const T* a, const T* dy, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const float g = detail::to_f(a[2 * i]), u = detail::to_f(a[2 * i + 1]), dd = detail::to_f(dy[i]);
    const float sg = 1.0f / (1.0f + expf(-g));
    da[2 * i] = detail::from_f<T>(dd * u * sg * (1.0f + g * (1.0f - sg)));
    da[2 * i + 1] = detail::from_f<T>(dd * g * sg);
  }
}

template <Activation T>
void swiglu_forward(Cuda& d, T* y, const T* a, index n) {
  if (n <= 0) return;
  swiglu_forward_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(y), detail::dev(a), n);
  check_launch("swiglu_forward");
}
template <Activation T>
void swiglu_backward(Cuda& d, T* da, const T* a, const T* dy, index n) {
  if (n <= 0) return;
  swiglu_backward_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(da), detail::dev(a),
                                                                             detail::dev(dy), n);
  check_launch("swiglu_backward");
}

}  // namespace weft::cuda

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
