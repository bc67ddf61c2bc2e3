// ops::CrossEntropy on the Cuda device (see cross_entropy.hpp for the op's template and the host's).
//
// CUDA kernels: the vocab-parallel cross-entropy, and the loss sum.
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::CrossEntropy (Cuda), cuda::ce_row_max, cuda::ce_row_stats, cuda::ce_backward, cuda::ce_loss
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/cross_entropy.hpp"

namespace weft::cuda {

// ---- Vocab-parallel cross-entropy -----------------------------------------------------------
// As on the host (ce_row_max, ce_row_stats, ce_backward), one block per row. The backward writes
// the logit gradients over the logits in place: no probability matrix is ever stored.

// f(column, value) over the first `count` elements of a row: 16-byte packs where the row is
// aligned, then the tail; threads of the block stride over the row.
template <class T, class F>
__device__ void row_for_each(const T* row, index count, F&& f) {
  constexpr int W = detail::Pack<T>::W;
  index done = 0;
  if (reinterpret_cast<std::uintptr_t>(row) % 16 == 0) {
    const index packs = count / W;
    for (index p = threadIdx.x; p < packs; p += blockDim.x) {
      const detail::Pack<T> a = detail::load_pack(row + p * W);
#pragma unroll
      for (int k = 0; k < W; ++k) f(p * W + k, detail::to_f(a.v[k]));
    }
    done = packs * W;
  }
  for (index v = done + threadIdx.x; v < count; v += blockDim.x) f(v, detail::to_f(row[v]));
}

template <class T, int Threads>
__global__ void ce_row_max_kernel(float* rowmax, const T* logits, index V, index valid) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  float m = -INFINITY;
  row_for_each(logits + blockIdx.x * V, valid, [&](index, float x) { m = fmaxf(m, x); });
  m = Reduce(tmp).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

template <class T, int Threads>
__global__ void ce_row_stats_kernel(float* stats, const T* logits, const float* rowmax, const std::int32_t* targets,
                                    index V, index valid, index begin) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  const index n = blockIdx.x;
  const T* row = logits + n * V;
  const float m = rowmax[n];
  float s = 0;
  row_for_each(row, valid, [&](index, float x) { s += __expf(x - m); });
  s = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) {
    const index t = targets[n] - begin;
    stats[2 * n] = s;
    stats[2 * n + 1] = (t >= 0 && t < valid) ? detail::to_f(row[t]) : 0.0f;
  }
}

template <class T>
__global__ void ce_backward_kernel(T* logits, const float* rowmax, const float* sums, index sum_stride,
                                   const std::int32_t* targets, index V, index valid, index begin, float scale) {
  constexpr int W = detail::Pack<T>::W;
  const index n = blockIdx.x;
  T* row = logits + n * V;
  const float m = rowmax[n], inv = 1.0f / sums[sum_stride * n];
  const index t = targets[n] - begin;
  auto grad = [&](index v, float x) {
    const float p = v < valid ? __expf(x - m) * inv : 0.0f;
    return detail::from_f<T>(scale * (p - (v == t ? 1.0f : 0.0f)));
  };
  index done = 0;
  if (reinterpret_cast<std::uintptr_t>(row) % 16 == 0) {
    const index packs = V / W;
    for (index p = threadIdx.x; p < packs; p += blockDim.x) {
      detail::Pack<T> a = detail::load_pack(row + p * W);
#pragma unroll
      for (int k = 0; k < W; ++k) a.v[k] = grad(p * W + k, detail::to_f(a.v[k]));
      detail::store_pack(row + p * W, a);
    }
    done = packs * W;
  }
  for (index v = done + threadIdx.x; v < V; v += blockDim.x) row[v] = grad(v, detail::to_f(row[v]));
}

template <Activation T>
void ce_row_max(Cuda& d, float* rowmax, const T* logits, index N, index V, index valid) {
  detail::require(valid <= V && valid >= 0, "ce_row_max", cat("valid ", valid, " of ", V, " columns"));
  if (N == 0) return;
  ce_row_max_kernel<detail::dev_t<T>, 256>
      <<<static_cast<unsigned>(N), 256, 0, d.stream()>>>(rowmax, detail::dev(logits), V, valid);
  check_launch("ce_row_max");
}
template <Activation T>
void ce_row_stats(Cuda& d, float* stats, const T* logits, const float* rowmax, const std::int32_t* targets, index N,
                  index V, index valid, index begin) {
  if (N == 0) return;
  ce_row_stats_kernel<detail::dev_t<T>, 256>
      <<<static_cast<unsigned>(N), 256, 0, d.stream()>>>(stats, detail::dev(logits), rowmax, targets, V, valid, begin);
  check_launch("ce_row_stats");
}
// sums: the sum of exponentials of row n at sums[sum_stride n]: the (N, 2) stats after the
// all-reduce (stride 2), or a compact (N) copy (stride 1).
template <Activation T>
void ce_backward(Cuda& d, T* logits_to_dlogits, const float* rowmax, const float* sums, const std::int32_t* targets,
                 index N, index V, index valid, index begin, float scale, index sum_stride = 2) {
  if (N == 0) return;
  ce_backward_kernel<<<static_cast<unsigned>(N), 256, 0, d.stream()>>>(detail::dev(logits_to_dlogits), rowmax, sums,
                                                                       sum_stride, targets, V, valid, begin, scale);
  check_launch("ce_backward");
}

// ---- The loss sum ----------------------------------------------------------------------------
template <int = 0>
__global__ void ce_loss_kernel(double* loss, float* sumexp, const float* stats, const float* rowmax, index N) {
  for (index n = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<index>(gridDim.x) * blockDim.x) {
    sumexp[n] = stats[2 * n];
    loss[n] = static_cast<double>(logf(stats[2 * n]) + rowmax[n] - stats[2 * n + 1]);
  }
}

// sumexp (N) = stats[., 0]; returns sum_n log(sumexp_n) + max_n - target_n on the host.
inline double ce_loss(Cuda& d, float* sumexp, const float* stats, const float* rowmax, index N) {
  if (N == 0) return 0.0;
  Allocation rows = d.allocate((N + 1) * static_cast<index>(sizeof(double)), Category::communication);
  auto* l = static_cast<double*>(rows.data());
  ce_loss_kernel<><<<detail::blocks_for(N, 256), 256, 0, d.stream()>>>(l, sumexp, stats, rowmax, N);
  check_launch("ce_loss");
  sum_in_order_kernel<><<<1, 1, 0, d.stream()>>>(l + N, l, N);
  check_launch("ce_loss (sum)");
  double r = 0;
  d.to_host(&r, l + N, sizeof(double));
  return r;
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct CrossEntropy<Cuda> {
  template <class T>
  static void row_max(Cuda& d, acc<T>* rowmax, const T* logits, index N, index V, index valid) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::ce_row_max(d, rowmax, logits, N, V, valid);
  }

  template <class T>
  static void row_stats(Cuda& d, acc<T>* stats, const T* logits, const acc<T>* rowmax, const std::int32_t* targets,
                        index N, index V, index valid, index begin) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::ce_row_stats(d, stats, logits, rowmax, targets, N, V, valid, begin);
  }

  static double loss(Cuda& d, float* sumexp, const float* stats, const float* rowmax, index N) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    return cuda::ce_loss(d, sumexp, stats, rowmax, N);
  }

  template <class T>
  static void backward(Cuda& d, T* dlogits, const T* logits, const acc<T>* rowmax, const acc<T>* sumexp,
                       const std::int32_t* targets, index N, index V, index valid, index begin, acc<T> scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (dlogits != logits)
      throw Error("ops::CrossEntropy<Cuda>::backward", "the gradient must overwrite the logits",
                  "pass the logits buffer twice");
    cuda::ce_backward(d, dlogits, rowmax, sumexp, targets, N, V, valid, begin, scale, 1);
  }
};

}  // namespace weft::ops
