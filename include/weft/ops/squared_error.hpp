// ops::SquaredError: the arithmetic of a mean-squared-error loss over predictions and targets of
// the same shape (nn::MseHeadStage's), n elements each:
//
//   sum       returns sum_i (pred_i - target_i)^2, in double on the host (the caller divides by the
//             global count and reduces over the ranks that share the batch)
//   backward  dpred_i = scale 2 (pred_i - target_i)   (scale: the gradient's 1 / count, times the
//             micro-batch's weight)
//
// An op (ops/op.hpp): the host's here, the Meta device's (nothing computed), the Cuda device's in
// squared_error.cuh. Sums run in a fixed order (the same bits on any thread count).
//
// defines: ops::SquaredError (Host, Meta), host::squared_error_sum, host::squared_error_backward
#pragma once

#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

template <class T>
double squared_error_sum(const T* pred, const T* target, index n) {
  double s = 0;
  for (index i = 0; i < n; ++i) {
    const double d = static_cast<double>(widen(pred[i])) - static_cast<double>(widen(target[i]));
    s += d * d;
  }
  return s;
}

template <class T, class S>
void squared_error_backward(T* dpred, const T* pred, const T* target, index n, S scale) {
  for (index i = 0; i < n; ++i) dpred[i] = narrow<T>(scale * S(2) * (widen(pred[i]) - widen(target[i])));
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct SquaredError;

template <>
struct SquaredError<Host> {
  template <class T>
  static double sum(Host&, const T* pred, const T* target, index n) {
    return host::squared_error_sum(pred, target, n);
  }
  template <class T>
  static void backward(Host&, T* dpred, const T* pred, const T* target, index n, acc<T> scale) {
    host::squared_error_backward(dpred, pred, target, n, scale);
  }
};

template <class D>
struct SquaredError<Meta<D>> {
  template <class... A>
  static double sum(Meta<D>&, A&&...) {
    return 0;
  }
  template <class... A>
  static void backward(Meta<D>&, A&&...) {}
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_SQUARED_ERROR_INSTANCES(EXTERN, T)                                                                 \
  EXTERN template double weft::ops::SquaredError<weft::Host>::sum<T>(weft::Host&, const T*, const T*, std::int64_t); \
  EXTERN template void weft::ops::SquaredError<weft::Host>::backward<T>(weft::Host&, T*, const T*, const T*,         \
                                                                        std::int64_t, weft::accumulate_t<T>);        \
  EXTERN template double weft::host::squared_error_sum<T>(const T*, const T*, std::int64_t);                         \
  EXTERN template void weft::host::squared_error_backward<T, weft::accumulate_t<T>>(                                 \
      T*, const T*, const T*, std::int64_t, weft::accumulate_t<T>);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_SQUARED_ERROR_INSTANCES)
