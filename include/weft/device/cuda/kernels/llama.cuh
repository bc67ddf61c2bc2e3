// CUDA kernels of the Llama family's ops: RMSNorm forward and backward, the rotary rotation of a
// fused qkv activation, and SwiGLU forward and backward (ops/rmsnorm.hpp, rotary.hpp, swiglu.hpp
// say what each computes; the host's are the reference the GPU tests hold these to).
//
// Statistics and sums in float, each in a fixed order (warp sums, one thread per column for the
// weight's gradient): the same bits in every run. Include only from .cu translation units.
#pragma once

#include <cmath>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/ops/rotary.hpp"

namespace weft::cuda {

// ---- RMSNorm: one warp per row ------------------------------------------------------------------
template <class T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, index N, index C, float eps) {
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + row * C;
  float s = 0;
  for (index c = lane; c < C; c += 32) {
    const float v = detail::to_f(xr[c]);
    s += v * v;
  }
  const float r = rsqrtf(detail::warp_sum(s) / static_cast<float>(C) + eps);
  for (index c = lane; c < C; c += 32) y[row * C + c] = detail::from_f<T>(detail::to_f(xr[c]) * r * detail::to_f(w[c]));
  if (lane == 0) rstd[row] = r;
}

template <class T>
__global__ void rmsnorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, index N, index C,
                                           const T* dresid) {
  const index row = blockIdx.x * static_cast<index>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float r = rstd[row];
  float s = 0;
  for (index c = lane; c < C; c += 32)
    s += detail::to_f(x[row * C + c]) * r * detail::to_f(w[c]) * detail::to_f(dy[row * C + c]);
  const float m = detail::warp_sum(s) / static_cast<float>(C);
  for (index c = lane; c < C; c += 32) {
    float g = r * (detail::to_f(w[c]) * detail::to_f(dy[row * C + c]) - detail::to_f(x[row * C + c]) * r * m);
    if (dresid) g += detail::to_f(dresid[row * C + c]);
    dx[row * C + c] = detail::from_f<T>(g);
  }
}

// dw[c] += sum over rows of x rstd dy, one thread per column, rows in order.
template <class T, class G>
__global__ void rmsnorm_backward_dw_kernel(G* dw, const T* dy, const T* x, const float* rstd, index N, index C) {
  for (index c = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; c < C; c += static_cast<index>(gridDim.x) * blockDim.x) {
    float s = 0;
    for (index n = 0; n < N; ++n) s += detail::to_f(x[n * C + c]) * rstd[n] * detail::to_f(dy[n * C + c]);
    dw[c] = detail::from_f<G>(detail::to_f(dw[c]) + s);
  }
}

template <Activation T>
void rmsnorm_forward(Cuda& d, T* y, float* rstd, const T* x, const T* w, index N, index C, float eps) {
  detail::require(C > 0 && N >= 0, "rmsnorm_forward", cat("N ", N, ", C ", C));
  if (N == 0) return;
  constexpr unsigned threads = 256, rows = threads / 32;
  rmsnorm_forward_kernel<<<static_cast<unsigned>((N + rows - 1) / rows), threads, 0, d.stream()>>>(
      detail::dev(y), rstd, detail::dev(x), detail::dev(w), N, C, eps);
  check_launch("rmsnorm_forward");
}

template <Activation T, Activation G>
void rmsnorm_backward(Cuda& d, T* dx, G* dw, const T* dy, const T* x, const T* w, const float* rstd, index N, index C,
                      const T* dresid = nullptr) {
  detail::require(C > 0 && N >= 0, "rmsnorm_backward", cat("N ", N, ", C ", C));
  if (N == 0) return;
  constexpr unsigned threads = 256, rows = threads / 32;
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>((N + rows - 1) / rows), threads, 0, d.stream()>>>(
      detail::dev(dx), detail::dev(dy), detail::dev(x), detail::dev(w), rstd, N, C, detail::dev(dresid));
  check_launch("rmsnorm_backward (dx)");
  rmsnorm_backward_dw_kernel<<<detail::blocks_for(C, 256), 256, 0, d.stream()>>>(detail::dev(dw), detail::dev(dy),
                                                                                detail::dev(x), rstd, N, C);
  check_launch("rmsnorm_backward (dw)");
}

// ---- Rotary: one thread per rotated pair ------------------------------------------------------------
// qkv (B, T, G, g + 2, hd): the g queries and the key of each group rotated by the angles
// pos.at(t) f_i (ops::Positions), f_i the frequencies (ops::rope_inv_freq, computed on the host, passed by value),
// each angle's cosine and sine taken in double and rounded to float, as the host's table is (sin
// negated for the backward). Nothing is allocated or copied per call.
inline constexpr index kMaxRopePairs = 256;  // head sizes up to 512 (kernel parameters: 2 KiB)
struct RopeFreqs {
  double f[kMaxRopePairs];
};

template <class T>
__global__ void rotary_kernel(T* qkv, RopeFreqs freqs, index B, index Tn, index G, index g, index hd, ops::Positions pos,
                              double sign) {
  const index half = hd / 2, per_token = G * (g + 1) * half;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < B * Tn * per_token;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index n = i / per_token, r = i % per_token, pair = r % half, slot = (r / half) % (g + 1), grp = r / (half * (g + 1));
    T* x = qkv + n * G * (g + 2) * hd + (grp * (g + 2) + slot) * hd;
    double sd, cd;
    const index t = n % Tn;
    sincos(static_cast<double>(t < pos.split ? pos.p0 + t : pos.p1 + (t - pos.split)) * freqs.f[pair], &sd, &cd);
    const float co = static_cast<float>(cd), si = static_cast<float>(sign * sd);
    const float a = detail::to_f(x[pair]), b = detail::to_f(x[pair + half]);
    x[pair] = detail::from_f<T>(a * co - b * si);
    x[pair + half] = detail::from_f<T>(b * co + a * si);
  }
}

template <Activation T>
void rotary(Cuda& d, T* qkv, index B, index Tn, index G, index g, index hd, const ops::Rope& rope, ops::Positions pos, double sign) {
  detail::require(hd > 0 && hd % 2 == 0 && g >= 1 && G >= 0, "rotary", cat("head size ", hd, ", group ", g));
  if (hd / 2 > kMaxRopePairs)
    throw Error("cuda::rotary", cat("head size ", hd, " is over ", 2 * kMaxRopePairs, ", the most the kernel takes frequencies for"),
                "use heads of at most 512 (raise cuda::kMaxRopePairs for more)");
  const index half = hd / 2, n = B * Tn * G * (g + 1) * half;
  if (n == 0) return;
  RopeFreqs freqs{};
  for (index i = 0; i < half; ++i) freqs.f[i] = ops::rope_inv_freq(i, hd, rope);
  rotary_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(qkv), freqs, B, Tn, G, g, hd, pos, sign);
  check_launch("rotary");
}

// ---- SwiGLU: one thread per output element ----------------------------------------------------------
template <class T>
__global__ void swiglu_forward_kernel(T* y, const T* a, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n; i += static_cast<index>(gridDim.x) * blockDim.x) {
    const float g = detail::to_f(a[2 * i]), u = detail::to_f(a[2 * i + 1]);
    y[i] = detail::from_f<T>(g / (1.0f + expf(-g)) * u);
  }
}
template <class T>
__global__ void swiglu_backward_kernel(T* da, const T* a, const T* dy, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n; i += static_cast<index>(gridDim.x) * blockDim.x) {
    const float g = detail::to_f(a[2 * i]), u = detail::to_f(a[2 * i + 1]), dd = detail::to_f(dy[i]);
    const float sg = 1.0f / (1.0f + expf(-g));
    da[2 * i] = detail::from_f<T>(dd * u * sg * (1.0f + g * (1.0f - sg)));
    da[2 * i + 1] = detail::from_f<T>(dd * g * sg);
  }
}

template <Activation T>
void swiglu_forward(Cuda& d, T* y, const T* a, index n) {
  if (n <= 0) return;
  swiglu_forward_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(y), detail::dev(a), n);
  check_launch("swiglu_forward");
}
template <Activation T>
void swiglu_backward(Cuda& d, T* da, const T* a, const T* dy, index n) {
  if (n <= 0) return;
  swiglu_backward_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(da), detail::dev(a), detail::dev(dy), n);
  check_launch("swiglu_backward");
}

}  // namespace weft::cuda
