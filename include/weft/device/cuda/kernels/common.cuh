// CUDA kernels: what every kernel shares (the element types, float and bf16 as __nv_bfloat16; 16-byte
// packs; launch sizing and size checks). The kernels themselves are in their op's file,
// ops/<op>.cuh, beside the op's Cuda specialization that calls them; this folder keeps what
// several share: this file, columns.cuh (column sums) and map.cuh (the elementwise map). Each
// kernel serves float and bf16 activations (math in float) with the host kernels' signatures
// (ops/<op>.hpp); each is a small config, its arguments and its body; each launcher checks sizes
// and the launch. The per-element math (GELU, AdamW) is weft/ops/math.hpp, shared with the host.
//
// Determinism: no float atomics anywhere. Row reductions use fixed trees (warp shuffles, CUB block
// reductions); column reductions (LayerNorm parameter gradients, bias and position gradients) go
// through per-block partial sums added in block order; the embedding backward sorts tokens (stable
// radix sort) and each run of equal tokens is summed by one thread per channel in position order;
// the gradient norm and the loss sum partials in a fixed order. Two runs give the same bits.
//
// Include only from .cu translation units.
#pragma once

#include <cuda_bf16.h>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "weft/core/bf16.hpp"
#include "weft/device/cuda/device.hpp"

namespace weft::cuda {

using index = std::int64_t;

template <class T>
concept Activation = std::same_as<T, float> || std::same_as<T, weft::bf16>;

namespace detail {

template <class T> struct dev_type {
  using type = T;
};
template <> struct dev_type<weft::bf16> {
  using type = __nv_bfloat16;
};
template <class T> using dev_t = typename dev_type<T>::type;

template <class T> dev_t<T>* dev(T* p) { return reinterpret_cast<dev_t<T>*>(p); }
template <class T> const dev_t<T>* dev(const T* p) { return reinterpret_cast<const dev_t<T>*>(p); }

__device__ inline float to_f(float x) { return x; }
__device__ inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ inline T from_f(float x);
template <> __device__ inline float from_f<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16 bytes of T: 8 bf16 or 4 floats, loaded and stored as one int4 (the vector width that lets a
// memory-bound kernel reach the copy bandwidth). Callers check 16-byte alignment first.
template <class T>
struct alignas(16) Pack {
  static constexpr int W = 16 / sizeof(T);
  T v[W];
};
template <class T>
__device__ inline Pack<T> load_pack(const T* p) {
  Pack<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}
template <class T>
__device__ inline void store_pack(T* p, const Pack<T>& r) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&r);
}
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
template <class... P>
bool all_aligned16(const P*... ps) {
  return (aligned16(ps) && ...);
}

inline unsigned blocks_for(index n, unsigned threads, unsigned cap = 65535u * 8u) {
  const index b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(cat("cuda::", op), what, "pass sizes that match the buffers");
}

}  // namespace detail

// out = x[0] + x[1] + ... + x[n - 1] in this order, on one thread: the last step of a sum that
// blocks first reduce to partial sums (the loss, the gradient norm), the same bits on every run.
template <int = 0>
__global__ void sum_in_order_kernel(double* out, const double* x, index n) {
  double s = 0;
  for (index i = 0; i < n; ++i) s += x[i];
  *out = s;
}

}  // namespace weft::cuda
