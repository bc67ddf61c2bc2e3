// CUDA ops, part 2: the vocab-parallel cross-entropy, multi-tensor AdamW and the global gradient
// norm (the conventions and the determinism notes are those of ops.cuh). Include ops.cuh.
#pragma once

#include "weft/device/cuda/ops_common.cuh"

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
  ce_row_max_kernel<detail::dev_t<T>, 256><<<static_cast<unsigned>(N), 256, 0, d.stream()>>>(rowmax, detail::dev(logits), V, valid);
  check_launch("ce_row_max");
}
template <Activation T>
void ce_row_stats(Cuda& d, float* stats, const T* logits, const float* rowmax, const std::int32_t* targets, index N,
                  index V, index valid, index begin) {
  if (N == 0) return;
  ce_row_stats_kernel<detail::dev_t<T>, 256><<<static_cast<unsigned>(N), 256, 0, d.stream()>>>(stats, detail::dev(logits), rowmax,
                                                                                 targets, V, valid, begin);
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

template <int = 0>
__global__ void sum_partials_kernel(double* out, const double* partial, unsigned n) {
  double s = 0;
  for (unsigned i = 0; i < n; ++i) s += partial[i];
  *out = s;
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
  sum_partials_kernel<><<<1, 1, 0, d.stream()>>>(static_cast<double*>(out.data()),
                                               static_cast<const double*>(partial.data()), table.count);
  check_launch("sum_squares (finish)");
  double r = 0;
  check(cudaMemcpyAsync(&r, out.data(), sizeof(double), cudaMemcpyDeviceToHost, d.stream()), "sum_squares (copy)");
  d.synchronize();
  return r;
}

}  // namespace weft::cuda

