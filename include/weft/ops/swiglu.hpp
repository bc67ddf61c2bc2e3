// ops::SwiGlu: the gated unit of Llama's MLP (Shazeer, 2020), y = silu(gate) up, over a fused
// gate-up activation whose features interleave the pairs, so that any contiguous shard of whole
// pairs holds matching gates and ups:
//
//   a (N, F, 2)   a[n, f, 0] the gate, a[n, f, 1] the up of feature f
//   y (N, F)      y = silu(gate) up,  silu(x) = x sigmoid(x)
//   backward:     dgate = dy up sigmoid(gate) (1 + gate (1 - sigmoid(gate))),  dup = dy silu(gate)
//
// In acc<T>, each element on its own: the same bits on any number of threads. double runs plain
// loops (the oracle); float and bf16 run on Eigen's vectorized exp, as GELU does. An op
// (ops/op.hpp): the host's here, the Meta device's below, the Cuda device's in swiglu.cuh.
//
// defines: ops::SwiGlu (Host, Meta)
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::ops {

template <class D>
struct SwiGlu;

template <>
struct SwiGlu<Host> {
  // n: the elements of y (N F).
  template <class T>
  static void forward(Host&, T* y, const T* a, index n) {
    using S = acc<T>;
    const host::Timed timed(host::Op::swiglu);
    host::split(n, host::kElements, [&](index lo, index hi) {
      if constexpr (std::same_as<T, double>) {  // the oracle: plain loops
        for (index i = lo; i < hi; ++i) {
          const S g = a[2 * i], u = a[2 * i + 1];
          y[i] = g / (S(1) + std::exp(-g)) * u;
        }
      } else {
        alignas(64) float ob[host::detail::kChunk];
        chunks(lo, hi, a, static_cast<const T*>(nullptr),
               [&](const auto& G, const auto& U, const auto&, index at, index len) {
                 host::detail::ChunkMap o(ob);
                 o = G * sigmoid(G) * U;
                 for (index i = 0; i < len; ++i) y[at + i] = narrow<T>(ob[i]);
               });
      }
    });
  }
  // da (N, F, 2) written from dy (N, F) and the saved a.
  template <class T>
  static void backward(Host&, T* da, const T* a, const T* dy, index n) {
    using S = acc<T>;
    const host::Timed timed(host::Op::swiglu);
    host::split(n, host::kElements, [&](index lo, index hi) {
      if constexpr (std::same_as<T, double>) {
        for (index i = lo; i < hi; ++i) {
          const S g = a[2 * i], u = a[2 * i + 1], d = dy[i];
          const S sg = S(1) / (S(1) + std::exp(-g));
          da[2 * i] = d * u * sg * (S(1) + g * (S(1) - sg));
          da[2 * i + 1] = d * g * sg;
        }
      } else {
        alignas(64) float gb[host::detail::kChunk], ub[host::detail::kChunk];
        chunks(lo, hi, a, dy, [&](const auto& G, const auto& U, const auto& D, index at, index len) {
          // 1 - sigmoid(g) as E sigmoid(g) (E = exp(-g)): accurate where sigmoid(g) rounds to 1
          const host::detail::Chunk E = exp_neg(G), s = 1.0f / (1.0f + E);
          host::detail::ChunkMap dg(gb), du(ub);
          dg = D * U * s * (1.0f + G * E * s);
          du = D * G * s;
          for (index i = 0; i < len; ++i) {
            da[2 * (at + i)] = narrow<T>(gb[i]);
            da[2 * (at + i) + 1] = narrow<T>(ub[i]);
          }
        });
      }
    });
  }

 private:
  // Float and bf16 on Eigen's vectorized exp, kChunk elements at a time widened into aligned
  // buffers (the last chunk padded with zeros): every element takes the same packet path wherever
  // it lies, so the bits do not depend on the split. Gates below -80 are taken at -80 (exp(80) is
  // finite in float; there silu, its slope and sigmoid are under 2e-33, where the exact values
  // round to 0 or a denormal).
  template <class A>
  static host::detail::Chunk exp_neg(const A& G) {
    return (-G).exp();
  }
  template <class A>
  static host::detail::Chunk sigmoid(const A& G) {
    return 1.0f / (1.0f + exp_neg(G));
  }
  // f(gates, ups, dy, at, len) for the chunks of elements [lo, hi); dy may be null (then zeros).
  template <class T, class F>
  static void chunks(index lo, index hi, const T* a, const T* dy, F f) {
    using host::detail::kChunk, host::detail::ChunkMap;
    alignas(64) float gb[kChunk], ub[kChunk], db[kChunk] = {};
    for (index at = lo; at < hi; at += kChunk) {
      const index len = std::min(kChunk, hi - at);
      for (index i = 0; i < len; ++i) {
        gb[i] = std::max(static_cast<float>(widen(a[2 * (at + i)])), -80.0f);
        ub[i] = static_cast<float>(widen(a[2 * (at + i) + 1]));
      }
      std::fill(gb + len, gb + kChunk, 0.0f);
      std::fill(ub + len, ub + kChunk, 0.0f);
      if (dy) {
        for (index i = 0; i < len; ++i) db[i] = static_cast<float>(widen(dy[at + i]));
        std::fill(db + len, db + kChunk, 0.0f);
      }
      f(ChunkMap(gb), ChunkMap(ub), ChunkMap(db), at, len);
    }
  }
};

template <class D>
struct SwiGlu<Meta<D>> {
  template <class A0, class A1, class... A>
  static void forward(Meta<D>& d, A0, A1, index n, A&&...) {
    d.work.gelu += static_cast<double>(n);
  }
  template <class A0, class A1, class A2, class... A>
  static void backward(Meta<D>& d, A0, A1, A2, index n, A&&...) {
    d.work.gelu += static_cast<double>(n);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_SWIGLU_INSTANCES(EXTERN, T)                                                              \
  EXTERN template void weft::ops::SwiGlu<weft::Host>::forward<T>(weft::Host&, T*, const T*, std::int64_t); \
  EXTERN template void weft::ops::SwiGlu<weft::Host>::backward<T>(weft::Host&, T*, const T*, const T*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_SWIGLU_INSTANCES)
