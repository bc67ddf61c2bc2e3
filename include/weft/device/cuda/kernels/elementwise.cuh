// CUDA kernels, elementwise: the GELU and its gradient, conversion, fill, and the residual add.
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
// families in include/weft/ops/*.cuh call them. Include only from .cu translation units.
#pragma once

#include "weft/device/cuda/kernels/common.cuh"

namespace weft::cuda {

// ---- GELU ------------------------------------------------------------------------------------
// out[i] = f(a[i], b[i]) over n elements: 16-byte packs, then the tail; a scalar kernel where the
// buffers are not 16-byte aligned.

struct GeluForward {
  __device__ float operator()(float x, float) const { return math::gelu(x); }
};
struct GeluBackward {
  __device__ float operator()(float x, float dout) const { return dout * math::gelu_grad(x); }
};

template <class T, class F>
__global__ void map2_vec_kernel(T* out, const T* a, const T* b, index n, F f) {
  constexpr int W = detail::Pack<T>::W;
  const index packs = n / W, stride = static_cast<index>(gridDim.x) * blockDim.x;
  const index tid = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x;
  for (index p = tid; p < packs; p += stride) {
    const detail::Pack<T> x = detail::load_pack(a + p * W);
    detail::Pack<T> y = x;
    if (b) y = detail::load_pack(b + p * W);
    detail::Pack<T> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = detail::from_f<T>(f(detail::to_f(x.v[k]), b ? detail::to_f(y.v[k]) : 0.0f));
    detail::store_pack(out + p * W, r);
  }
  for (index i = packs * W + tid; i < n; i += stride)
    out[i] = detail::from_f<T>(f(detail::to_f(a[i]), b ? detail::to_f(b[i]) : 0.0f));
}

template <class T, class F>
__global__ void map2_kernel(T* out, const T* a, const T* b, index n, F f) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    out[i] = detail::from_f<T>(f(detail::to_f(a[i]), b ? detail::to_f(b[i]) : 0.0f));
}

template <class T, class F>
void map2(Cuda& d, T* out, const T* a, const T* b, index n, F f, const char* op) {
  constexpr unsigned threads = 256;
  if (n == 0) return;
  if (detail::all_aligned16(out, a) && (!b || detail::aligned16(b)))
    map2_vec_kernel<<<detail::blocks_for(n / (16 / sizeof(T)) + 1, threads, 132 * 16), threads, 0, d.stream()>>>(
        detail::dev(out), detail::dev(a), detail::dev(b), n, f);
  else
    map2_kernel<<<detail::blocks_for(n, threads), threads, 0, d.stream()>>>(detail::dev(out), detail::dev(a),
                                                                           detail::dev(b), n, f);
  check_launch(op);
}

template <Activation T>
void gelu_forward(Cuda& d, T* out, const T* x, index n) {
  map2(d, out, x, static_cast<const T*>(nullptr), n, GeluForward{}, "gelu_forward");
}

// dx = dout gelu'(x).
template <Activation T>
void gelu_backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
  map2(d, dx, x, dout, n, GeluBackward{}, "gelu_backward");
}

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
