// ops::Silu: the SiLU (swish) and its gradient, on a buffer (DiT's conditioning: the timestep MLP's
// activation and the vector every adaLN projection reads).
//
//   forward:   out = x sigmoid(x)                                   x, out (n)
//   backward:  dx = dout sigmoid(x) (1 + x (1 - sigmoid(x)))
//
// An op (ops/op.hpp): the host's here (math in the accumulation type: double for double), the
// Meta device's (the work noted), the Cuda device's in silu.cuh.
//
// defines: ops::Silu (Host, Meta), host::silu_forward, host::silu_backward
#pragma once

#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

template <class T>
void silu_forward(T* out, const T* x, index n) {
  for (index i = 0; i < n; ++i) out[i] = narrow<T>(math::silu(widen(x[i])));
}

template <class T>
void silu_backward(T* dx, const T* x, const T* dout, index n) {
  for (index i = 0; i < n; ++i) dx[i] = narrow<T>(widen(dout[i]) * math::silu_grad(widen(x[i])));
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct Silu;

template <>
struct Silu<Host> {
  template <class T>
  static void forward(Host&, T* out, const T* x, index n) {
    host::silu_forward(out, x, n);
  }
  template <class T>
  static void backward(Host&, T* dx, const T* x, const T* dout, index n) {
    host::silu_backward(dx, x, dout, n);
  }
};

template <class D>
struct Silu<Meta<D>> {
  template <class T>
  static void forward(Meta<D>& d, T*, const T*, index n) {
    d.work.gelu += 0.5 * static_cast<double>(n);
  }
  template <class T>
  static void backward(Meta<D>& d, T*, const T*, const T*, index n) {
    d.work.gelu += 0.5 * static_cast<double>(n);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_SILU_INSTANCES(EXTERN, T)                                                                         \
  EXTERN template void weft::ops::Silu<weft::Host>::forward<T>(weft::Host&, T*, const T*, std::int64_t);            \
  EXTERN template void weft::ops::Silu<weft::Host>::backward<T>(weft::Host&, T*, const T*, const T*, std::int64_t); \
  EXTERN template void weft::host::silu_forward<T>(T*, const T*, std::int64_t);                                     \
  EXTERN template void weft::host::silu_backward<T>(T*, const T*, const T*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_SILU_INSTANCES)
