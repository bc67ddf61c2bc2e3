// ops::SwiGlu: the gated unit of Llama's MLP (Shazeer, 2020), y = silu(gate) up, over a fused
// gate-up activation whose features interleave the pairs, so that any contiguous shard of whole
// pairs holds matching gates and ups:
//
//   a (N, F, 2)   a[n, f, 0] the gate, a[n, f, 1] the up of feature f
//   y (N, F)      y = silu(gate) up,  silu(x) = x sigmoid(x)
//   backward:     dgate = dy up sigmoid(gate) (1 + gate (1 - sigmoid(gate))),  dup = dy silu(gate)
//
// In acc<T>, each element on its own: the same bits on any number of threads. An op family
// (ops/family.hpp): the host's here, the Meta device's below, the Cuda device's in swiglu.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/ops.hpp"
#include "weft/ops/family.hpp"

namespace weft::ops {

template <class D>
struct SwiGlu;

template <>
struct SwiGlu<Host> {
  // n: the elements of y (N F).
  template <class T>
  static void forward(Host&, T* y, const T* a, index n) {
    using S = acc<T>;
    const host::Timed timed(host::Op::elementwise);
    host::split(n, host::kElements, [&](index lo, index hi) {
      for (index i = lo; i < hi; ++i) {
        const S g = widen(a[2 * i]), u = widen(a[2 * i + 1]);
        y[i] = narrow<T>(g / (S(1) + std::exp(-g)) * u);
      }
    });
  }
  // da (N, F, 2) written from dy (N, F) and the saved a.
  template <class T>
  static void backward(Host&, T* da, const T* a, const T* dy, index n) {
    using S = acc<T>;
    const host::Timed timed(host::Op::elementwise);
    host::split(n, host::kElements, [&](index lo, index hi) {
      for (index i = lo; i < hi; ++i) {
        const S g = widen(a[2 * i]), u = widen(a[2 * i + 1]), d = widen(dy[i]);
        const S sg = S(1) / (S(1) + std::exp(-g));
        da[2 * i] = narrow<T>(d * u * sg * (S(1) + g * (S(1) - sg)));
        da[2 * i + 1] = narrow<T>(d * g * sg);
      }
    });
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
