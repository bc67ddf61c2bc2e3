// ops::RmsNorm: RMSNorm over rows of C (Zhang and Sennrich, 2019; Llama's), rstd saved for backward;
// the backward adds the residual stream's gradient (dresid) into dx where given, as LayerNorm's does.
//
//   forward:   y = x rstd w,  rstd = 1 / sqrt(mean(x^2) + eps)           (statistics in acc<T>)
//   backward:  dx = rstd (w dy - xh mean(xh w dy)) [+ dresid],  xh = x rstd;  dw += sum over rows xh dy
//
// An op (ops/op.hpp): the host's specialization here, the Meta device's below (it
// computes nothing); the Cuda device's in rmsnorm.cuh. Rows are split over the host's threads for dx
// and columns for dw, each summed in one fixed order: the same bits on any number of threads.
//
// defines: ops::RmsNorm (Host, Meta)
#pragma once

#include <cmath>
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
struct RmsNorm;

template <>
struct RmsNorm<Host> {
  // x, y (N, C); w (C); rstd (N) in acc<T>.
  template <class T>
  static void forward(Host&, T* y, acc<T>* rstd, const T* x, const T* w, index N, index C, acc<T> eps) {
    using S = acc<T>;
    const host::Timed timed(host::Op::rmsnorm);
    host::split(N, host::kRows, [&](index lo, index hi) {
      for (index n = lo; n < hi; ++n) {
        const T* xr = x + n * C;
        const S ms = host::row_sum<S>(C, [&](index c) { return widen(xr[c]) * widen(xr[c]); }) / static_cast<S>(C);
        const S r = S(1) / std::sqrt(ms + eps);
        for (index c = 0; c < C; ++c) y[n * C + c] = narrow<T>(widen(xr[c]) * r * widen(w[c]));
        rstd[n] = r;
      }
    });
  }

  // dy, x, dx (N, C); dw (C) accumulates; dresid (N, C) or null.
  template <class T>
  static void backward(Host&, T* dx, acc<T>* dw, const T* dy, const T* x, const T* w, const acc<T>* rstd, index N,
                       index C, const T* dresid = nullptr) {
    using S = acc<T>;
    const host::Timed timed(host::Op::rmsnorm);
    host::split(N, host::kRows, [&](index lo, index hi) {
      for (index n = lo; n < hi; ++n) {
        const T *xr = x + n * C, *dr = dy + n * C;
        const S r = rstd[n];
        const S m = host::row_sum<S>(C, [&](index c) { return widen(xr[c]) * r * widen(w[c]) * widen(dr[c]); }) /
                    static_cast<S>(C);
        for (index c = 0; c < C; ++c) {
          const S g = r * (widen(w[c]) * widen(dr[c]) - widen(xr[c]) * r * m);
          dx[n * C + c] = narrow<T>(dresid ? g + widen(dresid[n * C + c]) : g);
        }
      }
    });
    host::split(C, host::kColumns, [&](index lo, index hi) {
      for (index n = 0; n < N; ++n)
        for (index c = lo; c < hi; ++c) dw[c] += widen(x[n * C + c]) * rstd[n] * widen(dy[n * C + c]);
    });
  }
};

// The plan's device: priced as LayerNorm's elements (half a pass each way).
template <class D>
struct RmsNorm<Meta<D>> {
  template <class A0, class A1, class A2, class A3, class... A>
  static void forward(Meta<D>& d, A0, A1, A2, A3, index N, index C, A&&...) {
    d.work.layernorm += 0.5 * static_cast<double>(N) * static_cast<double>(C);
  }
  template <class A0, class A1, class A2, class A3, class A4, class A5, class... A>
  static void backward(Meta<D>& d, A0, A1, A2, A3, A4, A5, index N, index C, A&&...) {
    d.work.layernorm += 0.5 * static_cast<double>(N) * static_cast<double>(C);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_RMSNORM_INSTANCES(EXTERN, T)                                                                         \
  EXTERN template void weft::ops::RmsNorm<weft::Host>::forward<T>(                                                     \
      weft::Host&, T*, weft::accumulate_t<T>*, const T*, const T*, std::int64_t, std::int64_t, weft::accumulate_t<T>); \
  EXTERN template void weft::ops::RmsNorm<weft::Host>::backward<T>(weft::Host&, T*, weft::accumulate_t<T>*, const T*,  \
                                                                   const T*, const T*, const weft::accumulate_t<T>*,   \
                                                                   std::int64_t, std::int64_t, const T*);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_RMSNORM_INSTANCES)
