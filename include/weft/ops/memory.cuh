// ops::Memory and ops::Init on the Cuda device (see memory.hpp for the op's template and the host's).
//
// CUDA kernels: conversion, fill, and the residual add (on the elementwise map, device/cuda/kernels/map.cuh).
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Init (Cuda), ops::Memory (Cuda), cuda::convert, cuda::fill, cuda::add_inplace
#pragma once

#include <cstdint>
#include <vector>

#include "weft/device/cuda/kernels/map.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/memory.hpp"

namespace weft::cuda {

// ---- Conversion, fill, add ------------------------------------------------------------------
template <class To, class From>
__global__ void convert_kernel(To* out, const From* in, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    out[i] = detail::from_f<To>(detail::to_f(in[i]));
}

// out (n) = in, rounded (float -> bf16) or widened; float -> float copies.
template <Activation To, Activation From>
void convert(Cuda& d, To* out, const From* in, index n) {
  if (n <= 0) return;
  convert_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(out), detail::dev(in), n);
  check_launch("convert");
}

template <class T>
__global__ void fill_kernel(T* out, index n, float v) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    out[i] = detail::from_f<T>(v);
}

template <Activation T>
void fill(Cuda& d, T* out, index n, float v) {
  if (n <= 0) return;
  fill_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(out), n, v);
  check_launch("fill");
}

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out += x over n elements (the residual add; also f32 gradient slices).
template <Activation T>
void add_inplace(Cuda& d, T* out, const T* x, index n) {
  map2(d, out, static_cast<const T*>(out), x, n, Add{}, "add_inplace");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Memory<Cuda> {
  template <class T>
  static void zero(Cuda& d, T* out, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (n > 0) d.zero(out, static_cast<std::size_t>(n) * sizeof(T));
  }

  template <class T>
  static void copy(Cuda& d, T* out, const T* in, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (n > 0) d.copy(out, in, static_cast<std::size_t>(n) * sizeof(T));
  }

  template <class To, class From>
  static void convert(Cuda& d, To* out, const From* in, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if constexpr (std::same_as<To, From>) copy(d, out, in, n);
    else cuda::convert(d, out, in, n);
  }

  template <class T>
  static void fill(Cuda& d, T* out, index n, T v) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::fill(d, out, n, static_cast<float>(v));
  }

  template <class T>
  static void add(Cuda& d, T* out, const T* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::add_inplace(d, out, x, n);
  }
};

template <>
struct Init<Cuda> {
  // The host's draws (bitwise the same weights on every device), uploaded.
  template <class T>
  static void normal(Cuda& d, T* out, const Shape& global, const Shape& local, const Shape& offset, std::uint64_t seed,
                     std::uint64_t id, double std) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    std::vector<T> h(static_cast<std::size_t>(local.numel()));
    host::init_normal(h.data(), global, local, offset, seed, id, std);
    d.from_host(out, h.data(), h.size() * sizeof(T));
  }
};

}  // namespace weft::ops
