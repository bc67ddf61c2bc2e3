// ops::Route and ops::Dispatch on the Cuda device (see moe.hpp for the ops and the host's): float and
// bf16 activations, the router's probabilities and weights in float.
//
//   Route::forward, backward   one thread per token over its E <= 512 experts (math::route_row, the
//                              host's formula: softmax or sigmoid scores, an optional bias)
//   Route::stats               one block per expert (its slot count and probability sum over the
//                              tokens) and one for the sum of lse^2: CUB block reductions in
//                              double, in a fixed order: the same bits on every run
//   Dispatch::gather, combine  one thread per element
//   Dispatch::combine_backward one block per (token, slot): the weight's gradient a CUB block
//                              reduction over the width
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Route (Cuda), ops::Dispatch (Cuda)
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/moe.hpp"

namespace weft::cuda {

template <int = 0>
__global__ void route_forward_kernel(float* probs, std::int32_t* idx, float* weight, float* norm, const float* logits,
                                     const float* bias, index N, index E, index k, math::RouteRule<float> rule) {
  for (index n = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<index>(gridDim.x) * blockDim.x)
    norm[n] = math::route_row(probs + n * E, idx + n * k, weight + n * k, logits + n * E, bias, E, k, rule);
}

template <int Threads>
__global__ void route_stats_kernel(double* counts, double* psum, double* lse2, const float* probs,
                                   const std::int32_t* idx, const float* norm, index N, index E, index k,
                                   bool sigmoid) {
  using Reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  const index e = blockIdx.x;
  double c = 0, p = 0;
  for (index n = threadIdx.x; n < N; n += Threads) {
    if (e < E) {
      for (index j = 0; j < k; ++j) c += idx[n * k + j] == e ? 1.0 : 0.0;
      p += sigmoid ? static_cast<double>(probs[n * E + e]) / static_cast<double>(norm[n])
                   : static_cast<double>(probs[n * E + e]);
    } else if (!sigmoid) {
      p += static_cast<double>(norm[n]) * static_cast<double>(norm[n]);
    }
  }
  c = Reduce(tmp).Sum(c);
  __syncthreads();
  p = Reduce(tmp).Sum(p);
  if (threadIdx.x != 0) return;
  if (e < E) {
    counts[e] += c;
    psum[e] += p;
  } else {
    *lse2 += p;
  }
}

template <class T>
__global__ void route_backward_kernel(T* dlogits, const float* dweight, const float* probs, const std::int32_t* idx,
                                      const float* weight, const float* norm, index N, index E, index k,
                                      math::RouteRule<float> rule, const float* aux, float z) {
  for (index n = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<index>(gridDim.x) * blockDim.x) {
    float g[math::kMaxExperts];
    math::route_row_backward(g, dweight ? dweight + n * k : nullptr, probs + n * E, idx + n * k, weight + n * k,
                             norm[n], E, k, rule, aux, z);
    for (index e = 0; e < E; ++e) dlogits[n * E + e] = detail::from_f<T>(g[e]);
  }
}

template <class T>
__global__ void gather_rows_kernel(T* xp, const T* x, const std::int32_t* rows, index M, index C) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < M * C;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    xp[i] = x[rows[i / C] * C + i % C];
}

template <class T>
__global__ void combine_kernel(T* y, const T* xp, const std::int32_t* slot, const float* weight, index N, index k,
                               index C, bool accumulate) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index n = i / C, c = i % C;
    float s = accumulate ? detail::to_f(y[i]) : 0.0f;
    for (index j = 0; j < k; ++j) {
      const std::int32_t m = slot[n * k + j];
      if (m < 0) continue;
      const float v = detail::to_f(xp[m * C + c]);
      s += weight ? weight[n * k + j] * v : v;
    }
    y[i] = detail::from_f<T>(s);
  }
}

template <class T, int Threads>
__global__ void combine_backward_kernel(T* dxp, float* dweight, const T* dy, const T* xp, const std::int32_t* slot,
                                        const float* weight, index k, index C) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  const index p = blockIdx.x, n = p / k;  // one (token, slot) pair a block
  const std::int32_t m = slot[p];
  if (m < 0) {
    if (threadIdx.x == 0) dweight[p] = 0.0f;
    return;
  }
  const float w = weight[p];
  float dot = 0;
  for (index c = threadIdx.x; c < C; c += Threads) {
    const float g = detail::to_f(dy[n * C + c]);
    dot += g * detail::to_f(xp[m * C + c]);
    dxp[m * C + c] = detail::from_f<T>(w * g);
  }
  dot = Reduce(tmp).Sum(dot);
  if (threadIdx.x == 0) dweight[p] = dot;
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Route<Cuda> {
  static constexpr index max_experts = math::kMaxExperts;

  static void forward(Cuda& d, float* probs, std::int32_t* idx, float* weight, float* norm, const float* logits,
                      const float* bias, index N, index E, index k, const math::RouteRule<float>& rule) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::detail::require(N >= 0 && E >= 1 && E <= max_experts && k >= 1 && k <= E, "route_forward",
                          cat("N ", N, ", E ", E, ", k ", k));
    if (N == 0) return;
    cuda::route_forward_kernel<><<<cuda::detail::blocks_for(N, 128), 128, 0, d.stream()>>>(probs, idx, weight, norm,
                                                                                           logits, bias, N, E, k, rule);
    cuda::check_launch("route_forward");
  }

  // counts, psum and lse2 in the device's memory, added to.
  static void stats(Cuda& d, double* counts, double* psum, double* lse2, const float* probs, const std::int32_t* idx,
                    const float* norm, index N, index E, index k, math::Score score) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::route_stats_kernel<256><<<static_cast<unsigned>(E + 1), 256, 0, d.stream()>>>(
        counts, psum, lse2, probs, idx, norm, N, E, k, score == math::Score::sigmoid);
    cuda::check_launch("route_stats");
  }

  template <class T>
  static void backward(Cuda& d, T* dlogits, const float* dweight, const float* probs, const std::int32_t* idx,
                       const float* weight, const float* norm, index N, index E, index k,
                       const math::RouteRule<float>& rule, const float* aux, float z) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (N == 0) return;
    cuda::route_backward_kernel<<<cuda::detail::blocks_for(N, 128), 128, 0, d.stream()>>>(
        cuda::detail::dev(dlogits), dweight, probs, idx, weight, norm, N, E, k, rule, aux, z);
    cuda::check_launch("route_backward");
  }
};

template <>
struct Dispatch<Cuda> {
  template <class T>
  static void gather(Cuda& d, T* xp, const T* x, const std::int32_t* rows, index M, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (M * C == 0) return;
    cuda::gather_rows_kernel<<<cuda::detail::blocks_for(M * C, 256), 256, 0, d.stream()>>>(
        cuda::detail::dev(xp), cuda::detail::dev(x), rows, M, C);
    cuda::check_launch("moe gather");
  }
  template <class T>
  static void combine(Cuda& d, T* y, const T* xp, const std::int32_t* slot, const float* weight, index N, index k,
                      index C, bool accumulate) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (N * C == 0) return;
    cuda::combine_kernel<<<cuda::detail::blocks_for(N * C, 256), 256, 0, d.stream()>>>(
        cuda::detail::dev(y), cuda::detail::dev(xp), slot, weight, N, k, C, accumulate);
    cuda::check_launch("moe combine");
  }
  template <class T>
  static void combine_backward(Cuda& d, T* dxp, float* dweight, const T* dy, const T* xp, const std::int32_t* slot,
                               const float* weight, index N, index k, index C) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (N * k == 0) return;
    cuda::combine_backward_kernel<cuda::detail::dev_t<T>, 128><<<static_cast<unsigned>(N * k), 128, 0, d.stream()>>>(
        cuda::detail::dev(dxp), dweight, cuda::detail::dev(dy), cuda::detail::dev(xp), slot, weight, k, C);
    cuda::check_launch("moe combine_backward");
  }
};

}  // namespace weft::ops
