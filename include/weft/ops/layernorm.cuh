// ops::LayerNorm on the Cuda device (see layernorm.hpp for the op's template and the host's).
//
// CUDA kernels: LayerNorm forward (optionally with the residual add) and backward.
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::LayerNorm (Cuda), cuda::packs_per_lane, cuda::layernorm_forward, cuda::layernorm_backward
#pragma once

#include <cstdint>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/layernorm.hpp"

namespace weft::cuda {

// ---- LayerNorm -------------------------------------------------------------------------------
// Forward, one warp per row: optionally adds a residual first (resid_out = x + residual, the
// normalized input), then out = (r - mean) rstd w + b, saving mean and rstd (float).

template <class T>
__global__ void layernorm_forward_kernel(T* out, T* resid_out, float* mean, float* rstd, const T* x, const T* residual,
                                         const T* w, const T* b, index N, index C, float eps) {
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + row * C;
  auto in = [&](index c) {
    float v = detail::to_f(xr[c]);
    if (residual) v += detail::to_f(residual[row * C + c]);
    return v;
  };
  float s = 0;
  for (index c = lane; c < C; c += 32) {
    const float v = in(c);
    if (resid_out) resid_out[row * C + c] = detail::from_f<T>(v);
    s += v;
  }
  const float m = detail::warp_sum(s) / static_cast<float>(C);
  float q = 0;
  for (index c = lane; c < C; c += 32) {
    const float d = in(c)-m;
    q += d * d;
  }
  const float r = rsqrtf(detail::warp_sum(q) / static_cast<float>(C) + eps);
  for (index c = lane; c < C; c += 32)
    out[row * C + c] = detail::from_f<T>((in(c)-m) * r * detail::to_f(w[c]) + detail::to_f(b[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// The same with the row held in registers: each lane loads up to Packs 16-byte packs once.
// Requires C a multiple of the pack width, at most 32 Packs packs per row, 16-byte aligned buffers.
template <class T, int Packs>
__global__ void layernorm_forward_vec_kernel(T* out, T* resid_out, float* mean, float* rstd, const T* x,
                                             const T* residual, const T* w, const T* b, index N, index C, float eps) {
  constexpr int W = detail::Pack<T>::W;
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const index packs = C / W;
  float v[Packs][W];
  float s = 0;
#pragma unroll
  for (int j = 0; j < Packs; ++j) {
    const index p = lane + 32 * j;
    if (p >= packs) continue;
    const detail::Pack<T> a = detail::load_pack(x + row * C + p * W);
    detail::Pack<T> r = a;
    if (residual) r = detail::load_pack(residual + row * C + p * W);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      v[j][k] = detail::to_f(a.v[k]) + (residual ? detail::to_f(r.v[k]) : 0.0f);
      s += v[j][k];
    }
    if (resid_out) {
      detail::Pack<T> o;
#pragma unroll
      for (int k = 0; k < W; ++k) o.v[k] = detail::from_f<T>(v[j][k]);
      detail::store_pack(resid_out + row * C + p * W, o);
    }
  }
  const float m = detail::warp_sum(s) / static_cast<float>(C);
  float q = 0;
#pragma unroll
  for (int j = 0; j < Packs; ++j)
    if (lane + 32 * j < packs)
#pragma unroll
      for (int k = 0; k < W; ++k) q += (v[j][k] - m) * (v[j][k] - m);
  const float r = rsqrtf(detail::warp_sum(q) / static_cast<float>(C) + eps);
#pragma unroll
  for (int j = 0; j < Packs; ++j) {
    const index p = lane + 32 * j;
    if (p >= packs) continue;
    const detail::Pack<T> wp = detail::load_pack(w + p * W), bp = detail::load_pack(b + p * W);
    detail::Pack<T> o;
#pragma unroll
    for (int k = 0; k < W; ++k)
      o.v[k] = detail::from_f<T>((v[j][k] - m) * r * detail::to_f(wp.v[k]) + detail::to_f(bp.v[k]));
    detail::store_pack(out + row * C + p * W, o);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Packs per lane for a row of C elements when the register-resident kernels apply (0 otherwise).
template <class T>
int packs_per_lane(index C, int max_packs) {
  constexpr index W = 16 / sizeof(T);
  if (C % W != 0) return 0;
  const index per_lane = (C / W + 31) / 32;
  for (int p = 1; p <= max_packs; p *= 2)
    if (per_lane <= p) return p;
  return 0;
}

template <Activation T>
void layernorm_forward(Cuda& d, T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, index N, index C,
                       float eps, T* resid_out = nullptr, const T* residual = nullptr) {
  detail::require(C > 0 && N >= 0, "layernorm_forward", cat("N ", N, ", C ", C));
  if (N == 0) return;
  constexpr unsigned threads = 256, rows_per_block = threads / 32;
  const unsigned blocks = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
  using DT = detail::dev_t<T>;
  const bool aligned = detail::all_aligned16(out, x, w, b) && (!resid_out || detail::aligned16(resid_out)) &&
                       (!residual || detail::aligned16(residual));
  const int packs = aligned ? packs_per_lane<T>(C, 64 / (16 / static_cast<int>(sizeof(T)))) : 0;
  auto run = [&](auto kernel) {
    kernel<<<blocks, threads, 0, d.stream()>>>(detail::dev(out), detail::dev(resid_out), mean, rstd, detail::dev(x),
                                               detail::dev(residual), detail::dev(w), detail::dev(b), N, C, eps);
  };
  switch (packs) {
    case 1: run(layernorm_forward_vec_kernel<DT, 1>); break;
    case 2: run(layernorm_forward_vec_kernel<DT, 2>); break;
    case 4: run(layernorm_forward_vec_kernel<DT, 4>); break;
    case 8: run(layernorm_forward_vec_kernel<DT, 8>); break;
    case 16: run(layernorm_forward_vec_kernel<DT, 16>); break;
    default: run(layernorm_forward_kernel<DT>); break;
  }
  check_launch("layernorm_forward");
}

// Backward, input gradient: one warp per row; plus the residual stream's gradient where given.
template <class T>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean,
                                             const float* rstd, index N, index C, const T* dresid) {
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float m = mean[row], r = rstd[row];
  float sd = 0, sdn = 0;
  for (index c = lane; c < C; c += 32) {
    const float norm = (detail::to_f(x[row * C + c]) - m) * r;
    const float dn = detail::to_f(dout[row * C + c]) * detail::to_f(w[c]);
    sd += dn;
    sdn += dn * norm;
  }
  const float mean_d = detail::warp_sum(sd) / static_cast<float>(C);
  const float mean_dn = detail::warp_sum(sdn) / static_cast<float>(C);
  for (index c = lane; c < C; c += 32) {
    const float norm = (detail::to_f(x[row * C + c]) - m) * r;
    const float dn = detail::to_f(dout[row * C + c]) * detail::to_f(w[c]);
    const float g = (dn - mean_d - norm * mean_dn) * r;
    dx[row * C + c] = detail::from_f<T>(dresid ? g + detail::to_f(dresid[row * C + c]) : g);
  }
}

// Backward, parameter gradients, pass 1: block (column tile of 32, row chunk) sums its rows in a
// fixed order into partial[chunk][c] (dw) and partial[chunks + chunk][c] (db).
template <class T>
__global__ void layernorm_backward_partial_kernel(float* partial, const T* dout, const T* x, const float* mean,
                                                  const float* rstd, index N, index C, index rows_per_chunk) {
  __shared__ float sw[8][33], sb[8][33];
  const index c = blockIdx.x * 32 + threadIdx.x;
  const index chunk = blockIdx.y, r0 = chunk * rows_per_chunk, r1 = (r0 + rows_per_chunk < N) ? r0 + rows_per_chunk : N;
  float dw = 0, db = 0;
  if (c < C)
    for (index row = r0 + threadIdx.y; row < r1; row += 8) {
      const float d = detail::to_f(dout[row * C + c]);
      dw += d * (detail::to_f(x[row * C + c]) - mean[row]) * rstd[row];
      db += d;
    }
  sw[threadIdx.y][threadIdx.x] = dw;
  sb[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0, tb = 0;
    for (int i = 0; i < 8; ++i) {
      tw += sw[i][threadIdx.x];
      tb += sb[i][threadIdx.x];
    }
    partial[chunk * C + c] = tw;
    partial[(gridDim.y + chunk) * C + c] = tb;
  }
}

// Pass 2: dw[c] += sum over chunks in order; db likewise (G: float, or T).
template <class G>
__global__ void layernorm_backward_finish_kernel(G* dw, G* db, const float* partial, index chunks, index C) {
  const index c = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float tw = 0, tb = 0;
  for (index k = 0; k < chunks; ++k) {
    tw += partial[k * C + c];
    tb += partial[(chunks + k) * C + c];
  }
  dw[c] = detail::from_f<G>(detail::to_f(dw[c]) + tw);
  db[c] = detail::from_f<G>(detail::to_f(db[c]) + tb);
}

// dx written (plus dresid where given); dw, db accumulated (+=) in G (float for mixed precision,
// or T), as on the host.
template <Activation T, Activation G>
void layernorm_backward(Cuda& d, T* dx, G* dw, G* db, const T* dout, const T* x, const T* w, const float* mean,
                        const float* rstd, index N, index C, const T* dresid = nullptr) {
  detail::require(C > 0 && N >= 0, "layernorm_backward", cat("N ", N, ", C ", C));
  if (N == 0) return;
  constexpr unsigned threads = 256, rows_per_block = threads / 32;
  layernorm_backward_dx_kernel<<<static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block), threads, 0,
                                 d.stream()>>>(detail::dev(dx), detail::dev(dout), detail::dev(x), detail::dev(w), mean,
                                               rstd, N, C, detail::dev(dresid));
  check_launch("layernorm_backward (dx)");
  constexpr index rows_per_chunk = 256;
  const index chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  Allocation partial = d.allocate(2 * chunks * C * static_cast<index>(sizeof(float)), Category::communication);
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  layernorm_backward_partial_kernel<<<grid, dim3(32, 8), 0, d.stream()>>>(
      static_cast<float*>(partial.data()), detail::dev(dout), detail::dev(x), mean, rstd, N, C, rows_per_chunk);
  check_launch("layernorm_backward (partial sums)");
  layernorm_backward_finish_kernel<<<detail::blocks_for(C, 256), 256, 0, d.stream()>>>(
      detail::dev(dw), detail::dev(db), static_cast<const float*>(partial.data()), chunks, C);
  check_launch("layernorm_backward (finish)");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct LayerNorm<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* out, acc<T>* mean, acc<T>* rstd, const T* x, const T* w, const T* b, index N, index C,
                      acc<T> eps) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::layernorm_forward(d, out, mean, rstd, x, w, b, N, C, eps);
  }

  template <class T>
  static void backward(Cuda& d, T* dx, acc<T>* dw, acc<T>* db, const T* dout, const T* x, const T* w,
                       const acc<T>* mean, const acc<T>* rstd, index N, index C, const T* dresid = nullptr) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::layernorm_backward(d, dx, dw, db, dout, x, w, mean, rstd, N, C, dresid);
  }
};

}  // namespace weft::ops
