// ops::Gelu on the Cuda device (see gelu.hpp for the op's template and the host's).
//
// CUDA kernels: the GELU and its gradient, on the elementwise map (device/cuda/kernels/map.cuh).
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Gelu (Cuda), cuda::gelu_forward, cuda::gelu_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/map.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/gelu.hpp"
#include "weft/ops/math.hpp"

namespace weft::cuda {

// ---- GELU ------------------------------------------------------------------------------------
struct GeluForward {
  __device__ float operator()(float x, float) const { return math::gelu(x); }
};
struct GeluBackward {
  __device__ float operator()(float x, float dout) const { return dout * math::gelu_grad(x); }
};

template <Activation T>
void gelu_forward(Cuda& d, T* out, const T* x, index n) {
  map2(d, out, x, static_cast<const T*>(nullptr), n, GeluForward{}, "gelu_forward");
}

// dx = dout gelu'(x).
template <Activation T>
void gelu_backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
  map2(d, dx, x, dout, n, GeluBackward{}, "gelu_backward");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Gelu<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, const T* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::gelu_forward(d, out, x, n);
  }

  template <class T>
  static void backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::gelu_backward(d, dx, x, dout, n);
  }
};

}  // namespace weft::ops
