// ops::Bias: a bias on every row, and its gradient (a column sum).
//
//   add:       y (N, C) += b (C) on every row
//   backward:  db (C) += sum over rows of dy (N, C)
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in bias.cuh.
// Layers call ops::Bias<D>::add(dev, ...).
//
// defines: ops::Bias (Host, Meta), host::bias_add, host::bias_backward
#pragma once

#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

// y (N, C) += b (C) on every row (a Linear's bias).
template <class T>
void bias_add(T* y, const T* b, index N, index C) {
  for (index n = 0; n < N; ++n)
    for (index c = 0; c < C; ++c) y[n * C + c] = narrow<T>(widen(y[n * C + c]) + widen(b[c]));
}

// db (C) += the sum over rows of dy (N, C), rows in order.
template <class T, class S = accumulate_t<T>>
void bias_backward(S* db, const T* dy, index N, index C) {
  for (index n = 0; n < N; ++n)
    for (index c = 0; c < C; ++c) db[c] += widen(dy[n * C + c]);
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct Bias;

template <>
struct Bias<Host> {
  template <class T>
  static void add(Host&, T* y, const T* b, index N, index C) {
    const host::Timed timed(host::Op::elementwise);
    host::split(N, host::kRows, [&](index lo, index hi) { host::bias_add(y + lo * C, b, hi - lo, C); });
  }

  template <class T>
  static void backward(Host&, acc<T>* db, const T* dy, index N, index C) {
    const host::Timed timed(host::Op::elementwise);
    host::bias_backward(db, dy, N, C);
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct Bias<Meta<D>> {
  template <class... A> static void add(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_BIAS_INSTANCES(EXTERN, T)                                                                        \
  EXTERN template void weft::ops::Bias<weft::Host>::add<T>(weft::Host&, T*, const T*, std::int64_t, std::int64_t); \
  EXTERN template void weft::ops::Bias<weft::Host>::backward<T>(weft::Host&, weft::accumulate_t<T>*, const T*,     \
                                                                std::int64_t, std::int64_t);                       \
  EXTERN template void weft::host::bias_add<T>(T*, const T*, std::int64_t, std::int64_t);                          \
  EXTERN template void weft::host::bias_backward<T, weft::accumulate_t<T>>(weft::accumulate_t<T>*, const T*,       \
                                                                           std::int64_t, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_BIAS_INSTANCES)
