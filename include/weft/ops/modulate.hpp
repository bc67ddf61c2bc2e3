// ops::Modulate: a per-sample shift and scale of every row of a sample (adaptive normalization's
// modulation: DiT's adaLN, FiLM), from a modulation vector computed per sample, and a per-sample
// gate (adaLN-Zero's gate on a residual branch):
//
//   x    (B, Tl, C)   a rank's rows of B samples
//   mod  (B, 2C)      [shift | scale] of each sample
//   y    (B, Tl, C)   y[b, t, c] = x[b, t, c] (1 + scale[b, c]) + shift[b, c]
//
//   backward  dx[b, t, c] = dy[b, t, c] (1 + scale[b, c])
//             dmod (B, 2C) = [sum_t dy[b, t, c] | sum_t dy[b, t, c] x[b, t, c]]   (summed in S,
//             written in T)
//
//   gate      (B, C): y[b, t, c] = x[b, t, c] gate[b, c];  gate_backward: dx = dy gate,
//             dgate[b, c] = sum_t dy[b, t, c] x[b, t, c]
//
// An op (ops/op.hpp): the host's here, the Meta device's (nothing computed), the Cuda device's in
// modulate.cuh. The sums over t run in order (the same bits on any thread count).
//
// defines: ops::Modulate (Host, Meta), host::modulate_forward, host::modulate_backward, host::gate_forward,
//   host::gate_backward
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

template <class T>
void modulate_forward(T* y, const T* x, const T* mod, index B, index Tl, index C) {
  using S = accumulate_t<T>;
  for (index b = 0; b < B; ++b)
    for (index t = 0; t < Tl; ++t)
      for (index c = 0; c < C; ++c) {
        const index i = (b * Tl + t) * C + c;
        y[i] = narrow<T>(widen(x[i]) * (S(1) + widen(mod[b * 2 * C + C + c])) + widen(mod[b * 2 * C + c]));
      }
}

template <class T>
void modulate_backward(T* dx, T* dmod, const T* dy, const T* x, const T* mod, index B, index Tl, index C) {
  using S = accumulate_t<T>;
  std::vector<S> dshift(static_cast<std::size_t>(C)), dscale(static_cast<std::size_t>(C));
  for (index b = 0; b < B; ++b) {
    std::fill(dshift.begin(), dshift.end(), S(0));
    std::fill(dscale.begin(), dscale.end(), S(0));
    for (index t = 0; t < Tl; ++t)
      for (index c = 0; c < C; ++c) {
        const index i = (b * Tl + t) * C + c;
        const S g = widen(dy[i]);
        dshift[static_cast<std::size_t>(c)] += g;
        dscale[static_cast<std::size_t>(c)] += g * widen(x[i]);
        dx[i] = narrow<T>(g * (S(1) + widen(mod[b * 2 * C + C + c])));
      }
    for (index c = 0; c < C; ++c) {
      dmod[b * 2 * C + c] = narrow<T>(dshift[static_cast<std::size_t>(c)]);
      dmod[b * 2 * C + C + c] = narrow<T>(dscale[static_cast<std::size_t>(c)]);
    }
  }
}

template <class T>
void gate_forward(T* y, const T* x, const T* gate, index B, index Tl, index C) {
  for (index b = 0; b < B; ++b)
    for (index t = 0; t < Tl; ++t)
      for (index c = 0; c < C; ++c) {
        const index i = (b * Tl + t) * C + c;
        y[i] = narrow<T>(widen(x[i]) * widen(gate[b * C + c]));
      }
}

template <class T>
void gate_backward(T* dx, T* dgate, const T* dy, const T* x, const T* gate, index B, index Tl, index C) {
  using S = accumulate_t<T>;
  std::vector<S> dg(static_cast<std::size_t>(C));
  for (index b = 0; b < B; ++b) {
    std::fill(dg.begin(), dg.end(), S(0));
    for (index t = 0; t < Tl; ++t)
      for (index c = 0; c < C; ++c) {
        const index i = (b * Tl + t) * C + c;
        dg[static_cast<std::size_t>(c)] += widen(dy[i]) * widen(x[i]);
        dx[i] = narrow<T>(widen(dy[i]) * widen(gate[b * C + c]));
      }
    for (index c = 0; c < C; ++c) dgate[b * C + c] = narrow<T>(dg[static_cast<std::size_t>(c)]);
  }
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct Modulate;

template <>
struct Modulate<Host> {
  template <class T>
  static void forward(Host&, T* y, const T* x, const T* mod, index B, index Tl, index C) {
    host::modulate_forward(y, x, mod, B, Tl, C);
  }
  template <class T>
  static void backward(Host&, T* dx, T* dmod, const T* dy, const T* x, const T* mod, index B, index Tl, index C) {
    host::modulate_backward(dx, dmod, dy, x, mod, B, Tl, C);
  }
  template <class T>
  static void gate(Host&, T* y, const T* x, const T* gate, index B, index Tl, index C) {
    host::gate_forward(y, x, gate, B, Tl, C);
  }
  template <class T>
  static void gate_backward(Host&, T* dx, T* dgate, const T* dy, const T* x, const T* gate, index B, index Tl,
                            index C) {
    host::gate_backward(dx, dgate, dy, x, gate, B, Tl, C);
  }
};

template <class D>
struct Modulate<Meta<D>> : MetaPass<D> {
  template <class... A>
  static void gate(Meta<D>&, A&&...) {}
  template <class... A>
  static void gate_backward(Meta<D>&, A&&...) {}
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_MODULATE_INSTANCES(EXTERN, T)                                                                        \
  EXTERN template void weft::ops::Modulate<weft::Host>::forward<T>(weft::Host&, T*, const T*, const T*, std::int64_t,  \
                                                                   std::int64_t, std::int64_t);                        \
  EXTERN template void weft::ops::Modulate<weft::Host>::backward<T>(weft::Host&, T*, T*, const T*, const T*, const T*, \
                                                                    std::int64_t, std::int64_t, std::int64_t);         \
  EXTERN template void weft::ops::Modulate<weft::Host>::gate<T>(weft::Host&, T*, const T*, const T*, std::int64_t,     \
                                                                std::int64_t, std::int64_t);                           \
  EXTERN template void weft::ops::Modulate<weft::Host>::gate_backward<T>(                                              \
      weft::Host&, T*, T*, const T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t);                    \
  EXTERN template void weft::host::modulate_forward<T>(T*, const T*, const T*, std::int64_t, std::int64_t,             \
                                                       std::int64_t);                                                  \
  EXTERN template void weft::host::modulate_backward<T>(T*, T*, const T*, const T*, const T*, std::int64_t,            \
                                                        std::int64_t, std::int64_t);                                   \
  EXTERN template void weft::host::gate_forward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t);  \
  EXTERN template void weft::host::gate_backward<T>(T*, T*, const T*, const T*, const T*, std::int64_t, std::int64_t,  \
                                                    std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_MODULATE_INSTANCES)
