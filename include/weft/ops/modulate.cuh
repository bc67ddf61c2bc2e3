// ops::Modulate on the Cuda device (see modulate.hpp for the op and the host's): float and bf16
// activations, the math in float. forward and dx: one thread per element; dmod: one thread per
// (sample, channel), summing over the rows in order in float (no atomics: the same bits on every
// run), written in T.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Modulate (Cuda), cuda::modulate_forward, cuda::modulate_backward, cuda::gate_forward,
//   cuda::gate_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/modulate.hpp"

namespace weft::cuda {

template <class T>
__global__ void modulate_forward_kernel(T* y, const T* x, const T* mod, index B, index Tl, index C) {
  const index n = B * Tl * C;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index c = i % C, b = i / (Tl * C);
    const float scale = detail::to_f(mod[b * 2 * C + C + c]), shift = detail::to_f(mod[b * 2 * C + c]);
    y[i] = detail::from_f<T>(detail::to_f(x[i]) * (1.0f + scale) + shift);
  }
}

template <class T>
__global__ void modulate_dx_kernel(T* dx, const T* dy, const T* mod, index B, index Tl, index C) {
  const index n = B * Tl * C;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index c = i % C, b = i / (Tl * C);
    dx[i] = detail::from_f<T>(detail::to_f(dy[i]) * (1.0f + detail::to_f(mod[b * 2 * C + C + c])));
  }
}

template <class T>
__global__ void modulate_dmod_kernel(T* dmod, const T* dy, const T* x, index B, index Tl, index C) {
  const index n = B * C;
  for (index j = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<index>(gridDim.x) * blockDim.x) {
    const index c = j % C, b = j / C;
    float dshift = 0, dscale = 0;
    for (index t = 0; t < Tl; ++t) {
      const index i = (b * Tl + t) * C + c;
      const float g = detail::to_f(dy[i]);
      dshift += g;
      dscale += g * detail::to_f(x[i]);
    }
    dmod[b * 2 * C + c] = detail::from_f<T>(dshift);
    dmod[b * 2 * C + C + c] = detail::from_f<T>(dscale);
  }
}

template <class T>
__global__ void gate_forward_kernel(T* y, const T* x, const T* gate, index B, index Tl, index C) {
  const index n = B * Tl * C;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index c = i % C, b = i / (Tl * C);
    y[i] = detail::from_f<T>(detail::to_f(x[i]) * detail::to_f(gate[b * C + c]));
  }
}

template <class T>
__global__ void gate_dgate_kernel(T* dgate, const T* dy, const T* x, index B, index Tl, index C) {
  const index n = B * C;
  for (index j = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<index>(gridDim.x) * blockDim.x) {
    const index c = j % C, b = j / C;
    float s = 0;
    for (index t = 0; t < Tl; ++t) s += detail::to_f(dy[(b * Tl + t) * C + c]) * detail::to_f(x[(b * Tl + t) * C + c]);
    dgate[j] = detail::from_f<T>(s);
  }
}

template <Activation T>
void gate_forward(Cuda& d, T* y, const T* x, const T* gate, index B, index Tl, index C) {
  detail::require(B >= 0 && Tl >= 0 && C >= 0, "gate_forward", cat("B ", B, ", Tl ", Tl, ", C ", C));
  if (B * Tl * C == 0) return;
  gate_forward_kernel<<<detail::blocks_for(B * Tl * C, 256), 256, 0, d.stream()>>>(detail::dev(y), detail::dev(x),
                                                                                   detail::dev(gate), B, Tl, C);
  check_launch("gate_forward");
}

template <Activation T>
void gate_backward(Cuda& d, T* dx, T* dgate, const T* dy, const T* x, const T* gate, index B, index Tl, index C) {
  detail::require(B >= 0 && Tl >= 0 && C >= 0, "gate_backward", cat("B ", B, ", Tl ", Tl, ", C ", C));
  if (B * C == 0) return;
  gate_dgate_kernel<<<detail::blocks_for(B * C, 128), 128, 0, d.stream()>>>(detail::dev(dgate), detail::dev(dy),
                                                                            detail::dev(x), B, Tl, C);
  check_launch("gate_backward (dgate)");
  if (B * Tl * C == 0) return;
  gate_forward_kernel<<<detail::blocks_for(B * Tl * C, 256), 256, 0, d.stream()>>>(detail::dev(dx), detail::dev(dy),
                                                                                   detail::dev(gate), B, Tl, C);
  check_launch("gate_backward (dx)");
}

template <Activation T>
void modulate_forward(Cuda& d, T* y, const T* x, const T* mod, index B, index Tl, index C) {
  detail::require(B >= 0 && Tl >= 0 && C >= 0, "modulate_forward", cat("B ", B, ", Tl ", Tl, ", C ", C));
  if (B * Tl * C == 0) return;
  modulate_forward_kernel<<<detail::blocks_for(B * Tl * C, 256), 256, 0, d.stream()>>>(detail::dev(y), detail::dev(x),
                                                                                       detail::dev(mod), B, Tl, C);
  check_launch("modulate_forward");
}

template <Activation T>
void modulate_backward(Cuda& d, T* dx, T* dmod, const T* dy, const T* x, const T* mod, index B, index Tl, index C) {
  detail::require(B >= 0 && Tl >= 0 && C >= 0, "modulate_backward", cat("B ", B, ", Tl ", Tl, ", C ", C));
  if (B * C == 0) return;
  modulate_dmod_kernel<<<detail::blocks_for(B * C, 128), 128, 0, d.stream()>>>(detail::dev(dmod), detail::dev(dy),
                                                                               detail::dev(x), B, Tl, C);
  check_launch("modulate_backward (dmod)");
  if (B * Tl * C == 0) return;
  modulate_dx_kernel<<<detail::blocks_for(B * Tl * C, 256), 256, 0, d.stream()>>>(detail::dev(dx), detail::dev(dy),
                                                                                  detail::dev(mod), B, Tl, C);
  check_launch("modulate_backward (dx)");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Modulate<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* y, const T* x, const T* mod, index B, index Tl, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::modulate_forward(d, y, x, mod, B, Tl, C);
  }
  template <class T>
  static void backward(Cuda& d, T* dx, T* dmod, const T* dy, const T* x, const T* mod, index B, index Tl, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::modulate_backward(d, dx, dmod, dy, x, mod, B, Tl, C);
  }
  template <class T>
  static void gate(Cuda& d, T* y, const T* x, const T* gate, index B, index Tl, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::gate_forward(d, y, x, gate, B, Tl, C);
  }
  template <class T>
  static void gate_backward(Cuda& d, T* dx, T* dgate, const T* dy, const T* x, const T* gate, index B, index Tl,
                            index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::gate_backward(d, dx, dgate, dy, x, gate, B, Tl, C);
  }
};

}  // namespace weft::ops
