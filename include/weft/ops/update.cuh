// ops::Update and ops::Norm on the Cuda device (see update.hpp for the op's template and the host's).
//
// CUDA kernels: multi-tensor AdamW, the global gradient norm, and single-range AdamW and SGD.
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Norm (Cuda), ops::Update (Cuda), cuda::adamw, cuda::sum_squares, cuda::adamw_range,
//   cuda::sgd_range, cuda::sign_step_kernel
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/update.hpp"

namespace weft::cuda {

// ---- Multi-tensor AdamW and the global gradient norm ---------------------------------------

struct TensorRef {
  float* p = nullptr;        // parameters (AdamW) or the tensor (norm)
  const float* g = nullptr;  // gradients (AdamW)
  float* m = nullptr;
  float* v = nullptr;
  index n = 0;
  int decay = 1;  // AdamW: apply weight decay
};

namespace detail {
struct Chunk {
  int tensor;
  index offset, length;
};
inline constexpr index kChunk = 1 << 16;

// The chunk table of a tensor list, and both copied to the device.
struct ChunkTable {
  Allocation tensors, chunks;
  unsigned count = 0;
  ChunkTable(Cuda& d, std::span<const TensorRef> ts) {
    std::vector<Chunk> cs;
    for (std::size_t t = 0; t < ts.size(); ++t)
      for (index o = 0; o < ts[t].n; o += kChunk) cs.push_back({static_cast<int>(t), o, std::min(kChunk, ts[t].n - o)});
    count = static_cast<unsigned>(cs.size());
    tensors = d.allocate(static_cast<index>(ts.size() * sizeof(TensorRef)), Category::communication);
    chunks = d.allocate(static_cast<index>(cs.size() * sizeof(Chunk)), Category::communication);
    check(cudaMemcpyAsync(tensors.data(), ts.data(), ts.size() * sizeof(TensorRef), cudaMemcpyHostToDevice, d.stream()),
          "chunk table (tensors)");
    check(cudaMemcpyAsync(chunks.data(), cs.data(), cs.size() * sizeof(Chunk), cudaMemcpyHostToDevice, d.stream()),
          "chunk table (chunks)");
    d.synchronize();  // the host vectors go out of scope
  }
};
}  // namespace detail

template <int = 0>
__global__ void adamw_kernel(const TensorRef* tensors, const detail::Chunk* chunks, math::AdamW a, float grad_scale) {
  const detail::Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  const bool decay = t.decay != 0;
  index done = c.offset;
  const auto addr = reinterpret_cast<std::uintptr_t>(t.p) | reinterpret_cast<std::uintptr_t>(t.g) |
                    reinterpret_cast<std::uintptr_t>(t.m) | reinterpret_cast<std::uintptr_t>(t.v);
  if (addr % 16 == 0 && c.offset % 4 == 0) {  // float4 accesses: 16 bytes per load and store
    const index quads = c.length / 4;
    for (index q = threadIdx.x; q < quads; q += blockDim.x) {
      const index i = c.offset + 4 * q;
      float4 p = *reinterpret_cast<float4*>(t.p + i), m = *reinterpret_cast<float4*>(t.m + i),
             v = *reinterpret_cast<float4*>(t.v + i);
      const float4 g = *reinterpret_cast<const float4*>(t.g + i);
      math::adamw_step(p.x, g.x * grad_scale, m.x, v.x, a, decay);
      math::adamw_step(p.y, g.y * grad_scale, m.y, v.y, a, decay);
      math::adamw_step(p.z, g.z * grad_scale, m.z, v.z, a, decay);
      math::adamw_step(p.w, g.w * grad_scale, m.w, v.w, a, decay);
      *reinterpret_cast<float4*>(t.p + i) = p;
      *reinterpret_cast<float4*>(t.m + i) = m;
      *reinterpret_cast<float4*>(t.v + i) = v;
    }
    done = c.offset + 4 * quads;
  }
  for (index i = done + threadIdx.x; i < c.offset + c.length; i += blockDim.x)
    math::adamw_step(t.p[i], t.g[i] * grad_scale, t.m[i], t.v[i], a, decay);
}

// One launch over every tensor of the list (one block per 64K-element chunk); the gradients are
// multiplied by grad_scale (the clipping factor).
inline void adamw(Cuda& d, std::span<const TensorRef> tensors, const math::AdamW& a, float grad_scale = 1.0f) {
  const detail::ChunkTable table(d, tensors);
  if (table.count == 0) return;
  adamw_kernel<><<<table.count, 256, 0, d.stream()>>>(static_cast<const TensorRef*>(table.tensors.data()),
                                                      static_cast<const detail::Chunk*>(table.chunks.data()), a,
                                                      grad_scale);
  check_launch("adamw");
}

template <int Threads>
__global__ void sum_squares_kernel(double* partial, const TensorRef* tensors, const detail::Chunk* chunks) {
  using Reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  const detail::Chunk c = chunks[blockIdx.x];
  const float* x = tensors[c.tensor].p;
  double s = 0;
  for (index i = c.offset + threadIdx.x; i < c.offset + c.length; i += Threads) s += double(x[i]) * double(x[i]);
  s = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The sum of squares of every element of every tensor (accumulated in double), for the global
// gradient norm. Returns it on the host (synchronizes the stream).
inline double sum_squares(Cuda& d, std::span<const TensorRef> tensors) {
  const detail::ChunkTable table(d, tensors);
  if (table.count == 0) return 0.0;
  Allocation partial = d.allocate(static_cast<index>(table.count * sizeof(double)), Category::communication);
  Allocation out = d.allocate(sizeof(double), Category::communication);
  sum_squares_kernel<256><<<table.count, 256, 0, d.stream()>>>(static_cast<double*>(partial.data()),
                                                               static_cast<const TensorRef*>(table.tensors.data()),
                                                               static_cast<const detail::Chunk*>(table.chunks.data()));
  check_launch("sum_squares");
  sum_in_order_kernel<><<<1, 1, 0, d.stream()>>>(
      static_cast<double*>(out.data()), static_cast<const double*>(partial.data()), static_cast<index>(table.count));
  check_launch("sum_squares (finish)");
  double r = 0;
  check(cudaMemcpyAsync(&r, out.data(), sizeof(double), cudaMemcpyDeviceToHost, d.stream()), "sum_squares (copy)");
  d.synchronize();
  return r;
}

// ---- Single-range updates --------------------------------------------------------------------
template <int = 0>
__global__ void adamw_range_kernel(float* p, const float* g, float* m, float* v, index n, math::AdamW a, bool decay,
                                   float grad_scale) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    math::adamw_step(p[i], g[i] * grad_scale, m[i], v[i], a, decay);
}

// AdamW over one range of f32 parameters (the master weights under mixed precision).
inline void adamw_range(Cuda& d, float* p, const float* g, float* m, float* v, index n, const math::AdamW& a,
                        bool decay, double grad_scale) {
  if (n <= 0) return;
  adamw_range_kernel<>
      <<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(p, g, m, v, n, a, decay, static_cast<float>(grad_scale));
  check_launch("adamw");
}

template <int = 0>
__global__ void sgd_range_kernel(float* p, const float* g, float* buf, index n, float lr, float momentum, float wd,
                                 bool decay, float grad_scale) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    float dd = g[i] * grad_scale;
    if (decay) dd += wd * p[i];
    buf[i] = momentum * buf[i] + dd;
    p[i] -= lr * buf[i];
  }
}

inline void sgd_range(Cuda& d, float* p, const float* g, float* buf, index n, double lr, double momentum,
                      double weight_decay, bool decay, double grad_scale) {
  if (n <= 0) return;
  sgd_range_kernel<><<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(
      p, g, buf, n, static_cast<float>(lr), static_cast<float>(momentum), static_cast<float>(weight_decay), decay,
      static_cast<float>(grad_scale));
  check_launch("sgd");
}

template <int = 0>
__global__ void sign_step_kernel(float* p, const float* g, index n, float rate) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    p[i] -= rate * static_cast<float>(math::sign(g[i]));
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Update<Cuda> {
  template <class P, class S>
  static void adamw(Cuda& d, P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay,
                    double grad_scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float> && std::same_as<S, float>,
                  "ops::Update<Cuda>::adamw: the GPU updates f32 parameters (master weights under bf16)");
    cuda::adamw_range(d, p, g, m, v, n, a, decay, grad_scale);
  }

  template <class P, class S>
  static void sgd(Cuda& d, P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay,
                  bool decay, double grad_scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float> && std::same_as<S, float>,
                  "ops::Update<Cuda>::sgd: the GPU updates f32 parameters");
    cuda::sgd_range(d, p, g, buf, n, lr, momentum, weight_decay, decay, grad_scale);
  }

  template <class P>
  static void sign_step(Cuda& d, P* p, const P* g, index n, double rate) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float>, "ops::Update<Cuda>::sign_step: the GPU steps f32 parameters");
    if (n <= 0) return;
    cuda::sign_step_kernel<>
        <<<cuda::detail::blocks_for(n, 256), 256, 0, d.stream()>>>(p, g, n, static_cast<float>(rate));
    cuda::check_launch("sign_step");
  }

  // AdamW over every range of a step in one launch (Piece: p, g, state {m, v}, n, decay).
  template <class Pieces>
  static void adamw_many(Cuda& d, const Pieces& pieces, const math::AdamW& a, double grad_scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    std::vector<cuda::TensorRef> refs;
    for (const auto& x : pieces) refs.push_back({x.p, x.g, x.state[0], x.state[1], x.n, x.decay ? 1 : 0});
    cuda::adamw(d, refs, a, static_cast<float>(grad_scale));
  }
};

template <>
struct Norm<Cuda> {
  static double sum_squares_many(Cuda& d, std::span<const std::pair<const float*, index>> pieces) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    std::vector<cuda::TensorRef> refs;
    for (const auto& [p, n] : pieces) refs.push_back({.p = const_cast<float*>(p), .n = n});
    return cuda::sum_squares(d, refs);
  }

  static double sum_squares(Cuda& d, const float* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    const cuda::TensorRef r{.p = const_cast<float*>(x), .n = n};
    return cuda::sum_squares(d, std::span<const cuda::TensorRef>(&r, 1));
  }
};

}  // namespace weft::ops
