// ops::Silu on the Cuda device (see silu.hpp for the op and the host's): the elementwise map
// (device/cuda/kernels/map.cuh), the math in float.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Silu (Cuda), cuda::silu_forward, cuda::silu_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/map.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/silu.hpp"

namespace weft::cuda {

struct SiluForward {
  __device__ float operator()(float x, float) const { return math::silu(x); }
};
struct SiluBackward {
  __device__ float operator()(float x, float dout) const { return dout * math::silu_grad(x); }
};

template <Activation T>
void silu_forward(Cuda& d, T* out, const T* x, index n) {
  map2(d, out, x, static_cast<const T*>(nullptr), n, SiluForward{}, "silu_forward");
}

template <Activation T>
void silu_backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
  map2(d, dx, x, dout, n, SiluBackward{}, "silu_backward");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Silu<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, const T* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::silu_forward(d, out, x, n);
  }
  template <class T>
  static void backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::silu_backward(d, dx, x, dout, n);
  }
};

}  // namespace weft::ops
