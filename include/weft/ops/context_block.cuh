// ops::ContextBlock on the Cuda device (see context_block.hpp for the op's template and the host's): float
// and bf16 activations, the sums, the output being merged, the log-sum-exp and the gradients in
// float (S = accumulate_t<T> = float for both).
//
// CUDA kernels of ops::ContextBlock (ops/context_block.hpp says what each computes; the host's are
// the reference tests/device/cuda/context.cu holds these to): one block of attention over the
// context axis at a time, merged by log-sum-exp, with the mask by position (ops::Mask: causal or
// not, its padding lengths in device memory).
//
// One thread per query row (b, h, i) forward and for dq, one per key row (b, group, j) for dk and
// dv: each thread writes only its own row, sums run in float in key (or query) order, so two runs
// give the same bits (no atomics). A query row's scores are computed again in each pass (the row
// max, the sum, the weighted values) rather than kept: no (Tl, Tl) buffer, as the merge needs only
// the output and the log-sum-exp. Plain loops, not a tiled kernel: correctness first; a
// translation units.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::ContextBlock (Cuda), cuda::require_sizes, cuda::context_pack_kv, cuda::context_forward,
//   cuda::context_row_dots, cuda::context_backward, cuda::context_write_dqkv
#pragma once

#include <cmath>
#include <limits>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/context_block.hpp"
#include "weft/ops/memory.cuh"
#include "weft/ops/positions.hpp"

namespace weft::cuda {

namespace context_detail {

__device__ inline index q_at(index h, index hd, index g) { return ((h / g) * (g + 2) + h % g) * hd; }

template <class T>
__device__ inline float dot(const T* a, const T* b, index n) {
  float s = 0;
  for (index d = 0; d < n; ++d) s += detail::to_f(a[d]) * detail::to_f(b[d]);
  return s;
}

template <class T>
__global__ void pack_kv_kernel(T* kv, const T* qkv, index n, index G, index g, index hd) {
  const index per_row = G * 2 * hd, row = G * (g + 2) * hd;
  for (index e = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index>(gridDim.x) * blockDim.x) {
    const index r = e / per_row, rem = e % per_row, grp = rem / (2 * hd), d = rem % (2 * hd);
    kv[e] = qkv[r * row + (grp * (g + 2) + g) * hd + d];
  }
}

template <class T>
__global__ void forward_kernel(float* o, float* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd,
                               index g, ops::Positions qpos, ops::Positions kpos, float scale, ops::Mask m) {
  const index G = H / g, row = G * (g + 2) * hd, n = B * H * Tl;
  for (index t = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<index>(gridDim.x) * blockDim.x) {
    const index i = t % Tl, h = (t / Tl) % H, b = t / (Tl * H);
    const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
    const index p = qpos.at(i);
    const T* kv0 = kv + (b * Tl * G + h / g) * 2 * hd;  // row j's key: kv0 + j G 2 hd
    float mx = -INFINITY;
    for (index j = 0; j < Tl; ++j)
      if (m.sees(b, p, kpos.at(j))) mx = fmaxf(mx, dot(q, kv0 + j * G * 2 * hd, hd) * scale);
    if (mx == -INFINITY) continue;  // the query sees no key of the block
    float sum = 0;
    for (index j = 0; j < Tl; ++j)
      if (m.sees(b, p, kpos.at(j))) sum += expf(dot(q, kv0 + j * G * 2 * hd, hd) * scale - mx);
    const float lb = mx + logf(sum);
    float& l = lse[(b * H + h) * Tl + i];
    const float top = fmaxf(l, lb), merged = top + logf(expf(l - top) + expf(lb - top));
    const float wa = expf(l - merged), wb = expf(lb - merged);
    float* oi = o + ((b * Tl + i) * H + h) * hd;
    for (index d = 0; d < hd; ++d) oi[d] *= wa;
    for (index j = 0; j < Tl; ++j) {
      if (!m.sees(b, p, kpos.at(j))) continue;
      const T* k = kv0 + j * G * 2 * hd;
      const float w = expf(dot(q, k, hd) * scale - lb) * wb;
      for (index d = 0; d < hd; ++d) oi[d] += w * detail::to_f(k[hd + d]);
    }
    l = merged;
  }
}

template <class T>
__global__ void row_dots_kernel(float* D, const T* dout, const T* out, index B, index Tl, index H, index hd) {
  const index n = B * H * Tl;
  for (index t = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<index>(gridDim.x) * blockDim.x) {
    const index i = t % Tl, h = (t / Tl) % H, b = t / (Tl * H);
    const index at = ((b * Tl + i) * H + h) * hd;
    D[t] = dot(dout + at, out + at, hd);
  }
}

// dq of query row (b, h, i): sum over the visible keys j of dS_ij k_j.
template <class T>
__global__ void backward_dq_kernel(float* dq, const T* qkv, const T* kv, const T* dout, const float* D,
                                   const float* lse, index B, index Tl, index H, index hd, index g, ops::Positions qpos,
                                   ops::Positions kpos, float scale, ops::Mask m) {
  const index G = H / g, row = G * (g + 2) * hd, n = B * H * Tl;
  for (index t = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<index>(gridDim.x) * blockDim.x) {
    const index i = t % Tl, h = (t / Tl) % H, b = t / (Tl * H);
    const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
    const T* di = dout + ((b * Tl + i) * H + h) * hd;
    float* dqi = dq + (b * Tl + i) * row + q_at(h, hd, g);
    const index p = qpos.at(i);
    const float l = lse[t], Di = D[t];
    const T* kv0 = kv + (b * Tl * G + h / g) * 2 * hd;
    for (index j = 0; j < Tl; ++j) {
      if (!m.sees(b, p, kpos.at(j))) continue;
      const T* k = kv0 + j * G * 2 * hd;
      const float pij = expf(dot(q, k, hd) * scale - l), ds = pij * (dot(di, k + hd, hd) - Di) * scale;
      for (index d = 0; d < hd; ++d) dqi[d] += ds * detail::to_f(k[d]);
    }
  }
}

// dk and dv of key row (b, grp, j): sums over the group's g heads and the query rows i that see j.
template <class T>
__global__ void backward_dkv_kernel(float* dkv, const T* qkv, const T* kv, const T* dout, const float* D,
                                    const float* lse, index B, index Tl, index H, index hd, index g,
                                    ops::Positions qpos, ops::Positions kpos, float scale, ops::Mask m) {
  const index G = H / g, row = G * (g + 2) * hd, n = B * G * Tl;
  for (index t = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<index>(gridDim.x) * blockDim.x) {
    const index j = t % Tl, grp = (t / Tl) % G, b = t / (Tl * G);
    const T* k = kv + ((b * Tl + j) * G + grp) * 2 * hd;
    float* dk = dkv + ((b * Tl + j) * G + grp) * 2 * hd;
    const index kp = kpos.at(j);
    for (index h = grp * g; h < (grp + 1) * g; ++h)
      for (index i = 0; i < Tl; ++i) {
        if (!m.sees(b, qpos.at(i), kp)) continue;
        const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
        const T* di = dout + ((b * Tl + i) * H + h) * hd;
        const index r = (b * H + h) * Tl + i;
        const float pij = expf(dot(q, k, hd) * scale - lse[r]), ds = pij * (dot(di, k + hd, hd) - D[r]) * scale;
        for (index d = 0; d < hd; ++d) {
          dk[d] += ds * detail::to_f(q[d]);
          dk[hd + d] += pij * detail::to_f(di[d]);
        }
      }
  }
}

template <class T>
__global__ void write_dqkv_kernel(T* dqkv, const float* dq, const float* dkv, index n, index G, index g, index hd) {
  const index row = G * (g + 2) * hd, slot = (g + 2) * hd;
  for (index e = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index>(gridDim.x) * blockDim.x) {
    const index r = e / row, rem = e % row, grp = rem / slot, w = rem % slot;
    const float v = w < g * hd ? dq[e] : dkv[(r * G + grp) * 2 * hd + (w - g * hd)];
    dqkv[e] = detail::from_f<T>(v);
  }
}

inline void require_sizes(const char* op, index B, index Tl, index H, index hd, index g) {
  detail::require(B >= 0 && Tl >= 0 && hd > 0 && g > 0 && H > 0 && H % g == 0, op,
                  cat("B ", B, ", Tl ", Tl, ", H ", H, " heads in groups of ", g, ", head size ", hd));
}

}  // namespace context_detail

template <Activation T>
void context_pack_kv(Cuda& d, T* kv, const T* qkv, index B, index Tl, index H, index hd, index g) {
  context_detail::require_sizes("context_pack_kv", B, Tl, H, hd, g);
  const index n = B * Tl * (H / g) * 2 * hd;
  if (n == 0) return;
  context_detail::pack_kv_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(kv), detail::dev(qkv),
                                                                                     n, H / g, g, hd);
  check_launch("context_pack_kv");
}

template <Activation T>
void context_forward(Cuda& d, float* o, float* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd,
                     index g, ops::Positions qpos, ops::Positions kpos, ops::Mask m = {}) {
  context_detail::require_sizes("context_forward", B, Tl, H, hd, g);
  const index n = B * H * Tl;
  if (n == 0) return;
  context_detail::forward_kernel<<<detail::blocks_for(n, 128), 128, 0, d.stream()>>>(
      o, lse, detail::dev(qkv), detail::dev(kv), B, Tl, H, hd, g, qpos, kpos, 1.0f / std::sqrt(static_cast<float>(hd)),
      m);
  check_launch("context_forward");
}

template <Activation T>
void context_row_dots(Cuda& d, float* D, const T* dout, const T* out, index B, index Tl, index H, index hd) {
  context_detail::require_sizes("context_row_dots", B, Tl, H, hd, 1);
  const index n = B * H * Tl;
  if (n == 0) return;
  context_detail::row_dots_kernel<<<detail::blocks_for(n, 128), 128, 0, d.stream()>>>(D, detail::dev(dout),
                                                                                      detail::dev(out), B, Tl, H, hd);
  check_launch("context_row_dots");
}

template <Activation T>
void context_backward(Cuda& d, float* dq, float* dkv, const T* qkv, const T* kv, const T* dout, const float* D,
                      const float* lse, index B, index Tl, index H, index hd, index g, ops::Positions qpos,
                      ops::Positions kpos, ops::Mask m = {}) {
  context_detail::require_sizes("context_backward", B, Tl, H, hd, g);
  if (B * H * Tl == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  context_detail::backward_dq_kernel<<<detail::blocks_for(B * H * Tl, 128), 128, 0, d.stream()>>>(
      dq, detail::dev(qkv), detail::dev(kv), detail::dev(dout), D, lse, B, Tl, H, hd, g, qpos, kpos, scale, m);
  check_launch("context_backward (dq)");
  context_detail::backward_dkv_kernel<<<detail::blocks_for(B * (H / g) * Tl, 128), 128, 0, d.stream()>>>(
      dkv, detail::dev(qkv), detail::dev(kv), detail::dev(dout), D, lse, B, Tl, H, hd, g, qpos, kpos, scale, m);
  check_launch("context_backward (dk, dv)");
}

template <Activation T>
void context_write_dqkv(Cuda& d, T* dqkv, const float* dq, const float* dkv, index B, index Tl, index H, index hd,
                        index g) {
  context_detail::require_sizes("context_write_dqkv", B, Tl, H, hd, g);
  const index n = B * Tl * (H / g) * (g + 2) * hd;
  if (n == 0) return;
  context_detail::write_dqkv_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(dqkv), dq, dkv, n,
                                                                                        H / g, g, hd);
  check_launch("context_write_dqkv");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct ContextBlock<Cuda> {
  template <class T>
  static void pack_kv(Cuda& d, T* kv, const T* qkv, index B, index Tl, index H, index hd, index g) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::context_pack_kv(d, kv, qkv, B, Tl, H, hd, g);
  }
  static void start(Cuda& d, float* o, float* lse, index B, index Tl, index H, index hd) {
    Memory<Cuda>::zero(d, o, B * Tl * H * hd);
    Memory<Cuda>::fill(d, lse, B * H * Tl, -std::numeric_limits<float>::infinity());
  }
  template <class T>
  static void forward(Cuda& d, float* o, float* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd,
                      index g, Positions qpos, Positions kpos, Mask m = {}) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::context_forward(d, o, lse, qkv, kv, B, Tl, H, hd, g, qpos, kpos, m);
  }
  template <class T>
  static void finish(Cuda& d, T* out, const float* o, index n) {
    Memory<Cuda>::convert(d, out, o, n);
  }
  template <class T>
  static void row_dots(Cuda& d, float* D, const T* dout, const T* out, index B, index Tl, index H, index hd) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::context_row_dots(d, D, dout, out, B, Tl, H, hd);
  }
  template <class T>
  static void backward(Cuda& d, float* dq, float* dkv, const T* qkv, const T* kv, const T* dout, const float* D,
                       const float* lse, index B, index Tl, index H, index hd, index g, Positions qpos, Positions kpos,
                       Mask m = {}) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::context_backward(d, dq, dkv, qkv, kv, dout, D, lse, B, Tl, H, hd, g, qpos, kpos, m);
  }
  template <class T>
  static void write_dqkv(Cuda& d, T* dqkv, const float* dq, const float* dkv, index B, index Tl, index H, index hd,
                         index g) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::context_write_dqkv(d, dqkv, dq, dkv, B, Tl, H, hd, g);
  }
};

}  // namespace weft::ops
