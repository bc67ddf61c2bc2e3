// ops::Gelu: the GELU (tanh approximation) and its gradient.
//
//   forward:   out = 0.5 x (1 + tanh(k (x + c x^3))),  k = sqrt(2 / pi), c = 0.044715    x, out (n)
//   backward:  dx = dout gelu'(x)
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in gelu.cuh.
// Layers call ops::Gelu<D>::forward(dev, ...).
//
// defines: ops::Gelu (Host, Meta), host::gelu_forward, host::gelu_backward
#pragma once

#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

// out = gelu(x) (math::gelu, the tanh form). double: std::tanh per element (the oracle). float and
// bf16: in float on Eigen's vectorized exp, through 1 + tanh(u) = 2 s with s = 1 / (1 + E),
// E = exp(-2u), so gelu(x) = x s; and 1 - tanh(u)^2 = 4 s^2 E in the gradient: both accurate in
// the tails, where 1 - tanh(u) in float is 0. x is clamped to [-10, 10] inside (gelu is x or 0 there
// to float precision, slope 1 or 0), so E stays finite: gelu = xc s + max(x - 10, 0).

namespace detail {

inline constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;
template <class A>
Chunk gelu_exp(const A& Xc) {  // E = exp(-2u) at the clamped x
  return ((-2.0f * kGeluK) * (Xc + kGeluC * Xc * Xc * Xc)).min(80.0f).exp();
}

}  // namespace detail

template <class T>
void gelu_forward(T* out, const T* x, index n) {
  if constexpr (std::same_as<T, double>) {
    for (index i = 0; i < n; ++i) out[i] = math::gelu(x[i]);
  } else {
    detail::chunked(out, x, static_cast<const T*>(nullptr), n, [&](const auto& X, const auto&) {
      const detail::Chunk Xc = X.max(-10.0f).min(10.0f);
      return detail::Chunk(Xc / (1.0f + detail::gelu_exp(Xc)) + (X - 10.0f).max(0.0f));
    });
  }
}

// dx = dout gelu'(x) (math::gelu_grad) = dout (s + 2 x s^2 E du), du = k (1 + 3 c x^2); computed
// as gelu_forward is.
template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, index n) {
  if constexpr (std::same_as<T, double>) {
    for (index i = 0; i < n; ++i) dx[i] = dout[i] * math::gelu_grad(x[i]);
  } else {
    using detail::kGeluK, detail::kGeluC;
    detail::chunked(dx, x, dout, n, [&](const auto& X, const auto& D) {
      const detail::Chunk Xc = X.max(-10.0f).min(10.0f), E = detail::gelu_exp(Xc), s = 1.0f / (1.0f + E);
      return detail::Chunk(D * (s + 2.0f * Xc * s * s * E * (kGeluK * (1.0f + 3.0f * kGeluC * Xc * Xc))));
    });
  }
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct Gelu;

template <>
struct Gelu<Host> {
  template <class T>
  static void forward(Host&, T* out, const T* x, index n) {
    const host::Timed timed(host::Op::gelu);
    host::split(n, host::kElements, [&](index lo, index hi) { host::gelu_forward(out + lo, x + lo, hi - lo); });
  }

  template <class T>
  static void backward(Host&, T* dx, const T* x, const T* dout, index n) {
    const host::Timed timed(host::Op::gelu);
    host::split(n, host::kElements,
                [&](index lo, index hi) { host::gelu_backward(dx + lo, x + lo, dout + lo, hi - lo); });
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct Gelu<Meta<D>> {
  template <class T> static void forward(Meta<D>& d, T*, const T*, index n) {
    d.work.gelu += 0.5 * static_cast<double>(n);
  }
  template <class T> static void backward(Meta<D>& d, T*, const T*, const T*, index n) {
    d.work.gelu += 0.5 * static_cast<double>(n);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_GELU_INSTANCES(EXTERN, T)                                                                         \
  EXTERN template void weft::ops::Gelu<weft::Host>::forward<T>(weft::Host&, T*, const T*, std::int64_t);            \
  EXTERN template void weft::ops::Gelu<weft::Host>::backward<T>(weft::Host&, T*, const T*, const T*, std::int64_t); \
  EXTERN template void weft::host::gelu_forward<T>(T*, const T*, std::int64_t);                                     \
  EXTERN template void weft::host::gelu_backward<T>(T*, const T*, const T*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_GELU_INSTANCES)
