// ops::Embedding and ops::Position on the Cuda device (see embedding.hpp for the op's template and the host's).
//
// CUDA kernels: the vocab-parallel embedding (its backward sorts the tokens), and learned positions.
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Embedding (Cuda), ops::Position (Cuda), cuda::embedding_forward, cuda::embedding_backward,
//   cuda::position_forward, cuda::position_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/columns.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/embedding.hpp"
#include "weft/ops/positions.hpp"

namespace weft::cuda {

// ---- Embedding (vocab-parallel) -------------------------------------------------------------

template <class T>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* tokens, const T* table, index N, index C,
                                         index begin, index end) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index n = i / C, c = i % C, t = tokens[n];
    out[i] = (t >= begin && t < end) ? table[(t - begin) * C + c] : detail::from_f<T>(0.0f);
  }
}

// The same a 16-byte pack at a time (C a multiple of the pack width, aligned buffers).
template <class T>
__global__ void embedding_forward_vec_kernel(T* out, const std::int32_t* tokens, const T* table, index N, index C,
                                             index begin, index end) {
  constexpr int W = detail::Pack<T>::W;
  const index packs_per_row = C / W;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < N * packs_per_row;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index n = i / packs_per_row, c = (i % packs_per_row) * W, t = tokens[n];
    detail::Pack<T> r;
    if (t >= begin && t < end) {
      r = detail::load_pack(table + (t - begin) * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) r.v[k] = detail::from_f<T>(0.0f);
    }
    detail::store_pack(out + n * C + c, r);
  }
}

template <Activation T>
void embedding_forward(Cuda& d, T* out, const std::int32_t* tokens, const T* table, index N, index C, index begin,
                       index end) {
  if (N * C == 0) return;
  constexpr index W = 16 / sizeof(T);
  if (C % W == 0 && detail::all_aligned16(out, table))
    embedding_forward_vec_kernel<<<detail::blocks_for(N * C / W, 256), 256, 0, d.stream()>>>(
        detail::dev(out), tokens, detail::dev(table), N, C, begin, end);
  else
    embedding_forward_kernel<<<detail::blocks_for(N * C, 256), 256, 0, d.stream()>>>(
        detail::dev(out), tokens, detail::dev(table), N, C, begin, end);
  check_launch("embedding_forward");
}

// One block per sorted position i; only the first of each run of equal tokens works: its threads
// (one per channel) sum the run's rows in position order into the token's row (G: float or T).
template <class G, class T>
__global__ void embedding_backward_kernel(G* dtable, const T* dout, const std::int32_t* sorted_tokens,
                                          const std::int32_t* positions, index N, index C, index begin, index end) {
  const index i = blockIdx.x;
  const std::int32_t t = sorted_tokens[i];
  if ((i > 0 && sorted_tokens[i - 1] == t) || t < begin || t >= end) return;
  for (index c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0;
    for (index j = i; j < N && sorted_tokens[j] == t; ++j) acc += detail::to_f(dout[positions[j] * C + c]);
    G* row = dtable + (t - begin) * C;
    row[c] = detail::from_f<G>(detail::to_f(row[c]) + acc);
  }
}

template <int = 0>
__global__ void iota_kernel(std::int32_t* p, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::int32_t>(i);
}

// dtable += rows of dout for tokens in [begin, end); deterministic (no atomics).
template <Activation T, Activation G>
void embedding_backward(Cuda& d, G* dtable, const T* dout, const std::int32_t* tokens, index N, index C, index begin,
                        index end) {
  detail::require(N >= 0 && N < (index{1} << 31), "embedding_backward", cat("N ", N, " tokens"));
  if (N == 0) return;
  const auto bytes = static_cast<index>(N * sizeof(std::int32_t));
  Allocation keys = d.allocate(bytes, Category::communication), vals = d.allocate(bytes, Category::communication),
             pos = d.allocate(bytes, Category::communication);
  iota_kernel<><<<detail::blocks_for(N, 256), 256, 0, d.stream()>>>(static_cast<std::int32_t*>(pos.data()), N);
  check_launch("embedding_backward (iota)");
  std::size_t temp_bytes = 0;
  const int n = static_cast<int>(N);
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, static_cast<std::int32_t*>(keys.data()),
                                        static_cast<const std::int32_t*>(pos.data()),
                                        static_cast<std::int32_t*>(vals.data()), n, 0, 32, d.stream()),
        "embedding_backward (sort size)");
  Allocation temp = d.allocate(static_cast<index>(temp_bytes), Category::communication);
  check(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, tokens, static_cast<std::int32_t*>(keys.data()),
                                        static_cast<const std::int32_t*>(pos.data()),
                                        static_cast<std::int32_t*>(vals.data()), n, 0, 32, d.stream()),
        "embedding_backward (sort)");
  embedding_backward_kernel<<<static_cast<unsigned>(N), 256, 0, d.stream()>>>(
      detail::dev(dtable), detail::dev(dout), static_cast<const std::int32_t*>(keys.data()),
      static_cast<const std::int32_t*>(vals.data()), N, C, begin, end);
  check_launch("embedding_backward");
}

// ---- Learned positions -----------------------------------------------------------------------
template <class T>
__global__ void position_forward_kernel(T* x, const T* table, index B, index Tl, index C, ops::Positions pos) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < B * Tl * C;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index t = (i / C) % Tl, p = t < pos.split ? pos.p0 + t : pos.p1 + (t - pos.split);
    x[i] = detail::from_f<T>(detail::to_f(x[i]) + detail::to_f(table[p * C + i % C]));
  }
}

// x (B, Tl, C) += the table's rows at the positions of the Tl rows (ops::Positions).
template <Activation T>
void position_forward(Cuda& d, T* x, const T* table, index B, index Tl, index C, ops::Positions pos) {
  if (B * Tl * C == 0) return;
  position_forward_kernel<<<detail::blocks_for(B * Tl * C, 256), 256, 0, d.stream()>>>(
      detail::dev(x), detail::dev(table), B, Tl, C, pos);
  check_launch("position_forward");
}

// dtable's rows at the positions += dy (B, Tl, C) summed over the batch: a column sum of B rows of
// Tl C per run of positions.
template <Activation T, Activation G>
void position_backward(Cuda& d, G* dtable, const T* dy, index B, index Tl, index C, ops::Positions pos) {
  const index first = pos.split < Tl ? pos.split : Tl;
  column_sum_add(d, dtable + pos.p0 * C, dy, B, first * C, "position_backward", Tl * C);
  if (first < Tl)
    column_sum_add(d, dtable + pos.p1 * C, dy + first * C, B, (Tl - first) * C, "position_backward", Tl * C);
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Embedding<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, const std::int32_t* tokens, const T* table, index N, index C, index begin,
                      index end) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::embedding_forward(d, out, tokens, table, N, C, begin, end);
  }

  template <class T>
  static void backward(Cuda& d, acc<T>* dtable, const T* dout, const std::int32_t* tokens, index N, index C,
                       index begin, index end) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::embedding_backward(d, dtable, dout, tokens, N, C, begin, end);
  }
};

template <>
struct Position<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* x, const T* table, index B, index Tl, index C, Positions pos) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::position_forward(d, x, table, B, Tl, C, pos);
  }

  template <class T>
  static void backward(Cuda& d, acc<T>* dtable, const T* dy, index B, index Tl, index C, Positions pos) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::position_backward(d, dtable, dy, B, Tl, C, pos);
  }
};

}  // namespace weft::ops
