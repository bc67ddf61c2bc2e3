// ops::Attention on the Cuda device (see attention.hpp for the op's template and the host's).
//
// Self-attention on the GPU, forward and backward, causal or not, with or without padding
// (ops::Mask: its lengths in device memory, checked by whoever made them), head size a template
// parameter, the
// T x T scores materialized (the first version the design allows; a flash-style kernel replaces
// it later behind the same signature). Layouts, as on the host (host::attention_forward), with g
// heads per key-value group (GPT-2: g = 1; grouped-query attention: g > 1) and KV = H / g groups:
//
//   qkv   (B, T, KV, g + 2, hd)   each group's g queries, then its key and its value
//   out   (B, T, H, hd)
//   probs (B, H, T, T)       softmax(q k^T / sqrt(hd)), hidden keys masked to 0, in T (the activation
//                            type: rounded once, as the host does); kept for backward
//   dqkv  (B, T, KV, g + 2, hd)   every element written once (no accumulation, no atomics)
//
// Three kernels do all of it:
//   scores   S[i, j] = scale X_i . Y_j for the keys j query i sees (32 x 32 output tiles, rows of X
//            and Y in shared memory; tiles wholly in the future skipped when causal)
//                                                      forward: X = q, Y = k;  backward: X = dout, Y = v
//   softmax  one block per row over its keys [0, m.keys(b, i, T)), max and sum in f32 (CUB block
//            reductions, fixed order); exact zeros past them
//   mix      out_i = sum over the heads summed, sum_j M(i, j) X_j over the causal range, or all of
//            it when not causal (M or its transpose; 32 x 32 tiles; M is 0 where hidden)
//            forward: out = P v;  backward: dq = dS k, and for each group dk = sum over its g heads
//            of dS^T q, dv = sum of P^T dout (heads in order: a fixed order, no atomics)
// The f32 scratch S (B, H, T, T) lives only inside a call. Every sum runs in a fixed order, so
// results are bitwise repeatable.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Attention (Cuda), cuda::attention_forward, cuda::attention_backward
#pragma once

#include <cstdint>

#include "weft/core/error.hpp"
#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/attention.hpp"

namespace weft::cuda {

// Where row i of head h of a (B, T, ...) activation starts: base + (b T + i) row + at(h), with the
// heads in groups of g: at(h) = (h / g) group + (h % g) head + off. A query of a grouped qkv row is
// {row, (g + 2) hd, hd, (h % g) hd, g}; its group's key {row, (g + 2) hd, 0, g hd, g}.
struct HeadRows {
  index row, group, head, off, g = 1;
  __host__ __device__ index at(index h) const { return (h / g) * group + (h % g) * head + off; }
};

template <int HD, class T>
__global__ void attention_scores_kernel(float* S, const T* X, HeadRows xr, const T* Y, HeadRows yr, index Tn, int H,
                                        float scale, ops::Mask m) {
  __shared__ float xs[32][HD + 1], ys[32][HD + 1];
  const index bh = blockIdx.z, b = bh / H, h = bh % H;
  const index i0 = static_cast<index>(blockIdx.y) * 32, j0 = static_cast<index>(blockIdx.x) * 32;
  if (m.causal && j0 > i0 + 31) return;  // the whole tile is in the future (uniform over the block)
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int e = tid; e < 32 * HD; e += 1024) {
    const int r = e / HD, c = e % HD;
    const index i = i0 + r, j = j0 + r;
    xs[r][c] = i < Tn ? detail::to_f(X[(b * Tn + i) * xr.row + xr.at(h) + c]) : 0.0f;
    ys[r][c] = j < Tn ? detail::to_f(Y[(b * Tn + j) * yr.row + yr.at(h) + c]) : 0.0f;
  }
  __syncthreads();
  const index i = i0 + threadIdx.y, j = j0 + threadIdx.x;
  if (i < Tn && j < Tn && m.sees(b, i, j)) {
    float s = 0;
#pragma unroll 8
    for (int c = 0; c < HD; ++c) s += xs[threadIdx.y][c] * ys[threadIdx.x][c];
    S[(bh * Tn + i) * Tn + j] = s * scale;
  }
}

// P[i, j] = softmax over the keys j < n that query i sees of S[i, .]; 0 for j >= n. One block
// per (b, h, i).
template <class T, int Threads>
__global__ void attention_softmax_kernel(T* P, const float* S, index Tn, int H, ops::Mask mask) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float shared_max, shared_sum;
  const index row = blockIdx.x, i = row % Tn, n = mask.keys(row / (Tn * H), i, Tn);
  const float* s = S + row * Tn;
  T* p = P + row * Tn;
  float m = -INFINITY;
  for (index j = threadIdx.x; j < n; j += Threads) m = fmaxf(m, s[j]);
  m = Reduce(tmp).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) shared_max = m;
  __syncthreads();
  m = shared_max;
  float z = 0;
  for (index j = threadIdx.x; j < n; j += Threads) z += __expf(s[j] - m);
  z = Reduce(tmp).Sum(z);
  if (threadIdx.x == 0) shared_sum = z;
  __syncthreads();
  const float inv = 1.0f / shared_sum;
  for (index j = threadIdx.x; j < Tn; j += Threads) p[j] = detail::from_f<T>(j < n ? __expf(s[j] - m) * inv : 0.0f);
}

// dS[i, j] = P[i, j] (dP[i, j] - sum_k P[i, k] dP[i, k]) scale, in place of dP; 0 for the keys
// j >= n that query i does not see.
template <class T, int Threads>
__global__ void attention_softmax_backward_kernel(float* dP, const T* P, index Tn, int H, float scale, ops::Mask mask) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float shared_dot;
  const index row = blockIdx.x, i = row % Tn, n = mask.keys(row / (Tn * H), i, Tn);
  float* d = dP + row * Tn;
  const T* p = P + row * Tn;
  float dot = 0;
  for (index j = threadIdx.x; j < n; j += Threads) dot += detail::to_f(p[j]) * d[j];
  dot = Reduce(tmp).Sum(dot);
  if (threadIdx.x == 0) shared_dot = dot;
  __syncthreads();
  dot = shared_dot;
  for (index j = threadIdx.x; j < Tn; j += Threads) d[j] = j < n ? detail::to_f(p[j]) * (d[j] - dot) * scale : 0.0f;
}

// out_i[d] = sum over heads h = o sum, ..., o sum + sum - 1 of sum_j M_h(i, j) X_j[d] (X at head h)
// over the causal range: M_h(i, j) = M[b, h, i, j] for j <= i, or, with `transposed`, M[b, h, j, i]
// for j >= i; over every j when not `causal` (M holds exact zeros where the mask hides a key, so
// only the range differs); the output at index o of `orow`. sum = 1: one head each (out, dq); sum = g: a group's
// key or value gradient over its heads, in order. Block (32 d, 32 i); grid (ceil(HD / 32),
// ceil(T / 32), B H / sum).
template <int HD, class MT, class T>
__global__ void attention_mix_kernel(T* out, HeadRows orow, const MT* M, bool transposed, const T* X, HeadRows xr,
                                     index Tn, int H, int sum, bool causal) {
  __shared__ float ms[32][33], xs[32][33];
  const index outs = H / sum, bo = blockIdx.z, b = bo / outs, o = bo % outs;
  const index i0 = static_cast<index>(blockIdx.y) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const index d = static_cast<index>(blockIdx.x) * 32 + tx;
  const index i = i0 + ty;
  const index jbeg = transposed && causal ? i0 : 0, jend = transposed || !causal ? Tn : (i0 + 32 < Tn ? i0 + 32 : Tn);
  float acc = 0;
  for (int s = 0; s < sum; ++s) {
    const index h = o * sum + s, bh = b * H + h;
    for (index j0 = jbeg; j0 < jend; j0 += 32) {
      if (!transposed) {  // ms[ty][tx] = M[i0 + ty, j0 + tx]
        const index mi = i0 + ty, mj = j0 + tx;
        ms[ty][tx] = (mi < Tn && mj < Tn && (!causal || mj <= mi)) ? detail::to_f(M[(bh * Tn + mi) * Tn + mj]) : 0.0f;
      } else {  // ms[tx][ty] = M[j0 + ty, i0 + tx]: coalesced along the row of M
        const index mj = j0 + ty, mi = i0 + tx;
        ms[tx][ty] = (mj < Tn && mi < Tn && (!causal || mj >= mi)) ? detail::to_f(M[(bh * Tn + mj) * Tn + mi]) : 0.0f;
      }
      const index xj = j0 + ty;
      xs[ty][tx] = (xj < Tn && d < HD) ? detail::to_f(X[(b * Tn + xj) * xr.row + xr.at(h) + d]) : 0.0f;
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < 32; ++k) acc += ms[ty][k] * xs[k][tx];
      __syncthreads();
    }
  }
  if (i < Tn && d < HD) out[(b * Tn + i) * orow.row + orow.at(o) + d] = detail::from_f<T>(acc);
}

namespace detail {

// The rows of a grouped qkv activation (g heads per group, H heads) and of the (B, T, H, hd) output:
// each head's query, its group's key and value, and the keys and values indexed by group.
template <int HD>
struct QkvRows {
  index H, g;
  index row() const { return H / g * (g + 2) * HD; }
  HeadRows q() const { return {row(), (g + 2) * HD, HD, 0, g}; }
  HeadRows k() const { return {row(), (g + 2) * HD, 0, g * HD, g}; }
  HeadRows v() const { return {row(), (g + 2) * HD, 0, (g + 1) * HD, g}; }
  HeadRows k_of_group() const { return {row(), (g + 2) * HD, 0, g * HD, 1}; }
  HeadRows v_of_group() const { return {row(), (g + 2) * HD, 0, (g + 1) * HD, 1}; }
  HeadRows out() const { return {H * HD, HD, 0, 0, 1}; }
};

template <int HD, class T>
void attention_forward_hd(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index g, ops::Mask m) {
  using DT = dev_t<T>;
  const QkvRows<HD> r{H, g};
  const unsigned tiles = static_cast<unsigned>((Tn + 31) / 32), bh = static_cast<unsigned>(B * H);
  Allocation S = d.allocate(B * H * Tn * Tn * static_cast<index>(sizeof(float)), Category::activations);
  auto* s = static_cast<float*>(S.data());
  attention_scores_kernel<HD><<<dim3(tiles, tiles, bh), dim3(32, 32), 0, d.stream()>>>(
      s, dev(qkv), r.q(), dev(qkv), r.k(), Tn, static_cast<int>(H), 1.0f / sqrtf(static_cast<float>(HD)), m);
  check_launch("attention_forward (scores)");
  attention_softmax_kernel<DT, 256>
      <<<static_cast<unsigned>(B * H * Tn), 256, 0, d.stream()>>>(dev(probs), s, Tn, static_cast<int>(H), m);
  check_launch("attention_forward (softmax)");
  attention_mix_kernel<HD><<<dim3((HD + 31) / 32, tiles, bh), dim3(32, 32), 0, d.stream()>>>(
      dev(out), r.out(), dev(static_cast<const T*>(probs)), false, dev(qkv), r.v(), Tn, static_cast<int>(H), 1,
      m.causal);
  check_launch("attention_forward (P v)");
}

template <int HD, class T>
void attention_backward_hd(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                           index g, ops::Mask m) {
  const QkvRows<HD> r{H, g};
  const unsigned tiles = static_cast<unsigned>((Tn + 31) / 32), bh = static_cast<unsigned>(B * H),
                 groups = static_cast<unsigned>(B * (H / g));
  const dim3 block(32, 32);
  Allocation dP = d.allocate(B * H * Tn * Tn * static_cast<index>(sizeof(float)), Category::activations);
  auto* dp = static_cast<float*>(dP.data());
  const int h = static_cast<int>(H), gs = static_cast<int>(g);
  attention_scores_kernel<HD>
      <<<dim3(tiles, tiles, bh), block, 0, d.stream()>>>(dp, dev(dout), r.out(), dev(qkv), r.v(), Tn, h, 1.0f, m);
  check_launch("attention_backward (dP)");
  attention_softmax_backward_kernel<dev_t<T>, 256><<<static_cast<unsigned>(B * H * Tn), 256, 0, d.stream()>>>(
      dp, dev(probs), Tn, h, 1.0f / sqrtf(static_cast<float>(HD)), m);
  check_launch("attention_backward (dS)");
  const float* ds = dp;
  const unsigned hd_tiles = (HD + 31) / 32;
  attention_mix_kernel<HD><<<dim3(hd_tiles, tiles, bh), block, 0, d.stream()>>>(dev(dqkv), r.q(), ds, false, dev(qkv),
                                                                                r.k(), Tn, h, 1, m.causal);
  check_launch("attention_backward (dq)");
  attention_mix_kernel<HD><<<dim3(hd_tiles, tiles, groups), block, 0, d.stream()>>>(
      dev(dqkv), r.k_of_group(), ds, true, dev(qkv), r.q(), Tn, h, gs, m.causal);
  check_launch("attention_backward (dk)");
  attention_mix_kernel<HD><<<dim3(hd_tiles, tiles, groups), block, 0, d.stream()>>>(
      dev(dqkv), r.v_of_group(), dev(probs), true, dev(dout), r.out(), Tn, h, gs, m.causal);
  check_launch("attention_backward (dv)");
}

// The head sizes compiled: hd a template parameter, dispatched here.
template <class F>
void with_head_size(index hd, const char* op, F&& f) {
  switch (hd) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default:
      throw Error(cat("cuda::", op), cat("head size ", hd, " has no compiled kernel"),
                  "use a width / heads of 8, 16, 32, 64 or 128");
  }
}

}  // namespace detail

template <Activation T>
void attention_forward(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1,
                       ops::Mask m = {}) {
  detail::require(B >= 0 && Tn >= 0 && H >= 0 && g >= 1 && H % g == 0, "attention_forward",
                  cat("B ", B, ", T ", Tn, ", H ", H, ", heads per group ", g));
  if (B * Tn * H == 0) return;
  detail::with_head_size(hd, "attention_forward", [&](auto HD) {
    detail::attention_forward_hd<decltype(HD)::value>(d, out, probs, qkv, B, Tn, H, g, m);
  });
}

template <Activation T>
void attention_backward(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                        index hd, index g = 1, ops::Mask m = {}) {
  detail::require(B >= 0 && Tn >= 0 && H >= 0 && g >= 1 && H % g == 0, "attention_backward",
                  cat("B ", B, ", T ", Tn, ", H ", H, ", heads per group ", g));
  if (B * Tn * H == 0) return;
  detail::with_head_size(hd, "attention_backward", [&](auto HD) {
    detail::attention_backward_hd<decltype(HD)::value>(d, dqkv, dout, qkv, probs, B, Tn, H, g, m);
  });
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Attention<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1,
                      Mask m = {}) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::attention_forward(d, out, probs, qkv, B, Tn, H, hd, g, m);
  }

  template <class T>
  static void backward(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                       index hd, index g = 1, Mask m = {}) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::attention_backward(d, dqkv, dout, qkv, probs, B, Tn, H, hd, g, m);
  }
};

}  // namespace weft::ops
