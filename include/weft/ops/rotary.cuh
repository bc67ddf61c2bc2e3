// ops::Rotary on the Cuda device (see rotary.hpp for the op's template and the host's).
//
// CUDA kernels: one thread per rotated pair.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Rotary (Cuda), cuda::rotary
#pragma once

#include <cmath>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/rotary.hpp"

namespace weft::cuda {

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
__global__ void rotary_kernel(T* qkv, RopeFreqs freqs, index B, index Tn, index G, index g, index hd,
                              ops::Positions pos, double sign) {
  const index half = hd / 2, per_token = G * (g + 1) * half;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < B * Tn * per_token;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index n = i / per_token, r = i % per_token, pair = r % half, slot = (r / half) % (g + 1),
                grp = r / (half * (g + 1));
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
void rotary(Cuda& d, T* qkv, index B, index Tn, index G, index g, index hd, const ops::Rope& rope, ops::Positions pos,
            double sign) {
  detail::require(hd > 0 && hd % 2 == 0 && g >= 1 && G >= 0, "rotary", cat("head size ", hd, ", group ", g));
  if (hd / 2 > kMaxRopePairs)
    throw Error("cuda::rotary",
                cat("head size ", hd, " is over ", 2 * kMaxRopePairs, ", the most the kernel takes frequencies for"),
                "use heads of at most 512 (raise cuda::kMaxRopePairs for more)");
  const index half = hd / 2, n = B * Tn * G * (g + 1) * half;
  if (n == 0) return;
  RopeFreqs freqs{};
  for (index i = 0; i < half; ++i) freqs.f[i] = ops::rope_inv_freq(i, hd, rope);
  rotary_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(qkv), freqs, B, Tn, G, g, hd, pos,
                                                                    sign);
  check_launch("rotary");
}

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct Rotary<Cuda> {
  template <class T>
  static void forward(Cuda& d, T* qkv, index B, index Tn, index G, index g, index hd, const Rope& r,
                      Positions pos = {}) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::rotary(d, qkv, B, Tn, G, g, hd, r, pos, 1.0);
  }
  template <class T>
  static void backward(Cuda& d, T* dqkv, index B, index Tn, index G, index g, index hd, const Rope& r,
                       Positions pos = {}) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::rotary(d, dqkv, B, Tn, G, g, hd, r, pos, -1.0);
  }
};

}  // namespace weft::ops
