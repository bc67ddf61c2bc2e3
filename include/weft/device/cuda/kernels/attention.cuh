// Causal self-attention on the GPU, forward and backward, head size a template parameter, the
// T x T scores materialized (the first version the design allows; a flash-style kernel replaces
// it later behind the same signature). Layouts, as on the host (host::attention_forward):
//
//   qkv   (B, T, H, 3, hd)   q, k, v of each head side by side
//   out   (B, T, H, hd)
//   probs (B, H, T, T)       softmax(q k^T / sqrt(hd)), future masked to 0, in T (the activation
//                            type: rounded once, as the host does); kept for backward
//   dqkv  (B, T, H, 3, hd)   every element written once (no accumulation, no atomics)
//
// Three kernels do all of it:
//   scores   S[i, j] = scale X_i . Y_j for j <= i   (32 x 32 output tiles, rows of X and Y in shared
//            memory)                                   forward: X = q, Y = k;  backward: X = dout, Y = v
//   softmax  one block per row, max and sum in f32 (CUB block reductions, fixed order)
//   mix      out_i = sum_j M(i, j) X_j over the causal range (M or its transpose; 32 x 32 tiles)
//            forward: out = P v;  backward: dq = dS k, dk = dS^T q, dv = P^T dout
// The f32 scratch S (B, H, T, T) lives only inside a call. Every sum runs in a fixed order, so
// results are bitwise repeatable.
//
// Include only from .cu translation units (the op family ops/attention.cuh calls it).
#pragma once

#include "weft/device/cuda/kernels/common.cuh"

namespace weft::cuda {

// Where row i of head h of a (B, T, ...) activation starts: base + (b T + i) row + h head + off.
struct HeadRows {
  index row, head, off;
};

template <int HD, class T>
__global__ void attention_scores_kernel(float* S, const T* X, HeadRows xr, const T* Y, HeadRows yr, index Tn, int H,
                                        float scale) {
  __shared__ float xs[32][HD + 1], ys[32][HD + 1];
  const index bh = blockIdx.z, b = bh / H, h = bh % H;
  const index i0 = static_cast<index>(blockIdx.y) * 32, j0 = static_cast<index>(blockIdx.x) * 32;
  if (j0 > i0 + 31) return;  // the whole tile is in the future (uniform over the block)
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int e = tid; e < 32 * HD; e += 1024) {
    const int r = e / HD, c = e % HD;
    const index i = i0 + r, j = j0 + r;
    xs[r][c] = i < Tn ? detail::to_f(X[(b * Tn + i) * xr.row + h * xr.head + xr.off + c]) : 0.0f;
    ys[r][c] = j < Tn ? detail::to_f(Y[(b * Tn + j) * yr.row + h * yr.head + yr.off + c]) : 0.0f;
  }
  __syncthreads();
  const index i = i0 + threadIdx.y, j = j0 + threadIdx.x;
  if (i < Tn && j <= i) {
    float s = 0;
#pragma unroll 8
    for (int c = 0; c < HD; ++c) s += xs[threadIdx.y][c] * ys[threadIdx.x][c];
    S[(bh * Tn + i) * Tn + j] = s * scale;
  }
}

// P[i, j] = softmax over j <= i of S[i, .]; 0 for j > i. One block per (b, h, i).
template <class T, int Threads>
__global__ void attention_softmax_kernel(T* P, const float* S, index Tn) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float shared_max, shared_sum;
  const index row = blockIdx.x, i = row % Tn;
  const float* s = S + row * Tn;
  T* p = P + row * Tn;
  float m = -INFINITY;
  for (index j = threadIdx.x; j <= i; j += Threads) m = fmaxf(m, s[j]);
  m = Reduce(tmp).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) shared_max = m;
  __syncthreads();
  m = shared_max;
  float z = 0;
  for (index j = threadIdx.x; j <= i; j += Threads) z += __expf(s[j] - m);
  z = Reduce(tmp).Sum(z);
  if (threadIdx.x == 0) shared_sum = z;
  __syncthreads();
  const float inv = 1.0f / shared_sum;
  for (index j = threadIdx.x; j < Tn; j += Threads)
    p[j] = detail::from_f<T>(j <= i ? __expf(s[j] - m) * inv : 0.0f);
}

// dS[i, j] = P[i, j] (dP[i, j] - sum_k P[i, k] dP[i, k]) scale, in place of dP; 0 for j > i.
template <class T, int Threads>
__global__ void attention_softmax_backward_kernel(float* dP, const T* P, index Tn, float scale) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float shared_dot;
  const index row = blockIdx.x, i = row % Tn;
  float* d = dP + row * Tn;
  const T* p = P + row * Tn;
  float dot = 0;
  for (index j = threadIdx.x; j <= i; j += Threads) dot += detail::to_f(p[j]) * d[j];
  dot = Reduce(tmp).Sum(dot);
  if (threadIdx.x == 0) shared_dot = dot;
  __syncthreads();
  dot = shared_dot;
  for (index j = threadIdx.x; j < Tn; j += Threads) d[j] = j <= i ? detail::to_f(p[j]) * (d[j] - dot) * scale : 0.0f;
}

// out_i[d] = sum_j M(i, j) X_j[d] over the causal range: M(i, j) = M[i, j] for j <= i, or, with
// `transposed`, M[j, i] for j >= i. Block (32 d, 32 i); grid (ceil(HD / 32), ceil(T / 32), B H).
template <int HD, class MT, class T>
__global__ void attention_mix_kernel(T* out, HeadRows orow, const MT* M, bool transposed, const T* X, HeadRows xr,
                                     index Tn, int H) {
  __shared__ float ms[32][33], xs[32][33];
  const index bh = blockIdx.z, b = bh / H, h = bh % H;
  const index i0 = static_cast<index>(blockIdx.y) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const index d = static_cast<index>(blockIdx.x) * 32 + tx;
  const index i = i0 + ty;
  const index jbeg = transposed ? i0 : 0, jend = transposed ? Tn : (i0 + 32 < Tn ? i0 + 32 : Tn);
  float acc = 0;
  for (index j0 = jbeg; j0 < jend; j0 += 32) {
    if (!transposed) {  // ms[ty][tx] = M[i0 + ty, j0 + tx]
      const index mi = i0 + ty, mj = j0 + tx;
      ms[ty][tx] = (mi < Tn && mj <= mi) ? detail::to_f(M[(bh * Tn + mi) * Tn + mj]) : 0.0f;
    } else {  // ms[tx][ty] = M[j0 + ty, i0 + tx]: coalesced along the row of M
      const index mj = j0 + ty, mi = i0 + tx;
      ms[tx][ty] = (mj < Tn && mi < Tn && mj >= mi) ? detail::to_f(M[(bh * Tn + mj) * Tn + mi]) : 0.0f;
    }
    const index xj = j0 + ty;
    xs[ty][tx] = (xj < Tn && d < HD) ? detail::to_f(X[(b * Tn + xj) * xr.row + h * xr.head + xr.off + d]) : 0.0f;
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < 32; ++k) acc += ms[ty][k] * xs[k][tx];
    __syncthreads();
  }
  if (i < Tn && d < HD) out[(b * Tn + i) * orow.row + h * orow.head + orow.off + d] = detail::from_f<T>(acc);
}

namespace detail {

template <int HD, class T>
void attention_forward_hd(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H) {
  using DT = dev_t<T>;
  const HeadRows q{H * 3 * HD, 3 * HD, 0}, k{H * 3 * HD, 3 * HD, HD}, v{H * 3 * HD, 3 * HD, 2 * HD}, o{H * HD, HD, 0};
  const unsigned tiles = static_cast<unsigned>((Tn + 31) / 32), bh = static_cast<unsigned>(B * H);
  Allocation S = d.allocate(B * H * Tn * Tn * static_cast<index>(sizeof(float)), Category::activations);
  auto* s = static_cast<float*>(S.data());
  attention_scores_kernel<HD><<<dim3(tiles, tiles, bh), dim3(32, 32), 0, d.stream()>>>(
      s, dev(qkv), q, dev(qkv), k, Tn, static_cast<int>(H), 1.0f / sqrtf(static_cast<float>(HD)));
  check_launch("attention_forward (scores)");
  attention_softmax_kernel<DT, 256><<<static_cast<unsigned>(B * H * Tn), 256, 0, d.stream()>>>(dev(probs), s, Tn);
  check_launch("attention_forward (softmax)");
  attention_mix_kernel<HD><<<dim3((HD + 31) / 32, tiles, bh), dim3(32, 32), 0, d.stream()>>>(
      dev(out), o, dev(static_cast<const T*>(probs)), false, dev(qkv), v, Tn, static_cast<int>(H));
  check_launch("attention_forward (P v)");
}

template <int HD, class T>
void attention_backward_hd(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H) {
  const HeadRows q{H * 3 * HD, 3 * HD, 0}, k{H * 3 * HD, 3 * HD, HD}, v{H * 3 * HD, 3 * HD, 2 * HD}, o{H * HD, HD, 0};
  const unsigned tiles = static_cast<unsigned>((Tn + 31) / 32), bh = static_cast<unsigned>(B * H);
  const dim3 mix_grid((HD + 31) / 32, tiles, bh), block(32, 32);
  Allocation dP = d.allocate(B * H * Tn * Tn * static_cast<index>(sizeof(float)), Category::activations);
  auto* dp = static_cast<float*>(dP.data());
  const int h = static_cast<int>(H);
  attention_scores_kernel<HD><<<dim3(tiles, tiles, bh), block, 0, d.stream()>>>(dp, dev(dout), o, dev(qkv), v, Tn, h, 1.0f);
  check_launch("attention_backward (dP)");
  attention_softmax_backward_kernel<dev_t<T>, 256><<<static_cast<unsigned>(B * H * Tn), 256, 0, d.stream()>>>(
      dp, dev(probs), Tn, 1.0f / sqrtf(static_cast<float>(HD)));
  check_launch("attention_backward (dS)");
  const float* ds = dp;
  attention_mix_kernel<HD><<<mix_grid, block, 0, d.stream()>>>(dev(dqkv), q, ds, false, dev(qkv), k, Tn, h);
  check_launch("attention_backward (dq)");
  attention_mix_kernel<HD><<<mix_grid, block, 0, d.stream()>>>(dev(dqkv), k, ds, true, dev(qkv), q, Tn, h);
  check_launch("attention_backward (dk)");
  attention_mix_kernel<HD><<<mix_grid, block, 0, d.stream()>>>(dev(dqkv), v, dev(probs), true, dev(dout), o, Tn, h);
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
void attention_forward(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd) {
  detail::require(B >= 0 && Tn >= 0 && H >= 0, "attention_forward", cat("B ", B, ", T ", Tn, ", H ", H));
  if (B * Tn * H == 0) return;
  detail::with_head_size(hd, "attention_forward",
                         [&](auto HD) { detail::attention_forward_hd<decltype(HD)::value>(d, out, probs, qkv, B, Tn, H); });
}

template <Activation T>
void attention_backward(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                        index hd) {
  detail::require(B >= 0 && Tn >= 0 && H >= 0, "attention_backward", cat("B ", B, ", T ", Tn, ", H ", H));
  if (B * Tn * H == 0) return;
  detail::with_head_size(hd, "attention_backward", [&](auto HD) {
    detail::attention_backward_hd<decltype(HD)::value>(d, dqkv, dout, qkv, probs, B, Tn, H);
  });
}

}  // namespace weft::cuda
