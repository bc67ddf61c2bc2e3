// ops::LayerNorm: LayerNorm over rows of C, mean and rstd saved for backward; the backward adds the residual
// stream's gradient (dresid) into dx where given.
//
//   forward:   out = (x - mean) rstd w + b,  rstd = 1 / sqrt(var(x) + eps)    x, out (N, C); mean, rstd (N) in acc<T>
//   backward:  dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)) [+ dresid], dnorm = dout w;
//              dw += sum over rows dout norm;  db += sum over rows dout
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in layernorm.cuh.
// Layers call ops::LayerNorm<D>::forward(dev, ...).
//
// defines: ops::LayerNorm (Host, Meta), host::layernorm_forward, host::layernorm_backward_dx,
//   host::layernorm_backward_params, host::layernorm_backward
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

// LayerNorm over the last dim of x (N, C): out = (x - mean) rstd w + b; saves mean, rstd (N) in S.
template <class T, class S = accumulate_t<T>>
void layernorm_forward(T* out, S* mean, S* rstd, const T* x, const T* w, const T* b, index N, index C, S eps) {
  for (index n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    S m = row_sum<S>(C, [&](index c) { return widen(xr[c]); });
    m /= static_cast<S>(C);
    S v = row_sum<S>(C, [&](index c) { return (widen(xr[c]) - m) * (widen(xr[c]) - m); });
    v /= static_cast<S>(C);
    const S s = S(1) / std::sqrt(v + eps);
    for (index c = 0; c < C; ++c) out[n * C + c] = narrow<T>((widen(xr[c]) - m) * s * widen(w[c]) + widen(b[c]));
    mean[n] = m;
    rstd[n] = s;
  }
}

// dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)) with dnorm = dout w;  dw += sum dout norm;
// db += sum dout (sums over the N rows). With a residual gradient (not null), dx += dresid: the
// gradient of x + f(layernorm(x)) in one pass. In two parts, so that each can be split for threads
// without changing a bit: layernorm_backward_dx over rows [n0, n1), layernorm_backward_params over
// columns [c0, c1) (each column summed over every row, in order).
template <class T, class S = accumulate_t<T>>
void layernorm_backward_dx(T* dx, const T* dout, const T* x, const T* w, const S* mean, const S* rstd, index n0,
                           index n1, index C, const T* dresid = nullptr) {
  for (index n = n0; n < n1; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    S mean_d = row_sum<S>(C, [&](index c) { return widen(dr[c]) * widen(w[c]); });
    S mean_dn =
        row_sum<S>(C, [&](index c) { return widen(dr[c]) * widen(w[c]) * ((widen(xr[c]) - mean[n]) * rstd[n]); });
    mean_d /= static_cast<S>(C);
    mean_dn /= static_cast<S>(C);
    for (index c = 0; c < C; ++c) {
      const S norm = (widen(xr[c]) - mean[n]) * rstd[n];
      const S dnorm = widen(dr[c]) * widen(w[c]);
      const S g = (dnorm - mean_d - norm * mean_dn) * rstd[n];
      dx[n * C + c] = narrow<T>(dresid ? g + widen(dresid[n * C + c]) : g);
    }
  }
}

template <class T, class S = accumulate_t<T>>
void layernorm_backward_params(S* dw, S* db, const T* dout, const T* x, const S* mean, const S* rstd, index N, index C,
                               index c0, index c1) {
  for (index n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    for (index c = c0; c < c1; ++c) {
      const S norm = (widen(xr[c]) - mean[n]) * rstd[n];
      dw[c] += widen(dr[c]) * norm;
      db[c] += widen(dr[c]);
    }
  }
}

template <class T, class S = accumulate_t<T>>
void layernorm_backward(T* dx, S* dw, S* db, const T* dout, const T* x, const T* w, const S* mean, const S* rstd,
                        index N, index C, const T* dresid = nullptr) {
  layernorm_backward_dx(dx, dout, x, w, mean, rstd, index{0}, N, C, dresid);
  layernorm_backward_params(dw, db, dout, x, mean, rstd, N, C, index{0}, C);
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct LayerNorm;

template <>
struct LayerNorm<Host> {
  // LayerNorm over rows of C: mean and rstd (N) saved for backward. The backward adds dresid (the
  // residual stream's gradient) into dx when it is not null.
  template <class T>
  static void forward(Host&, T* out, acc<T>* mean, acc<T>* rstd, const T* x, const T* w, const T* b, index N, index C,
                      acc<T> eps) {
    const host::Timed timed(host::Op::layernorm);
    host::split(N, host::kRows, [&](index lo, index hi) {
      host::layernorm_forward(out + lo * C, mean + lo, rstd + lo, x + lo * C, w, b, hi - lo, C, eps);
    });
  }

  template <class T>
  static void backward(Host&, T* dx, acc<T>* dw, acc<T>* db, const T* dout, const T* x, const T* w, const acc<T>* mean,
                       const acc<T>* rstd, index N, index C, const T* dresid = nullptr) {
    const host::Timed timed(host::Op::layernorm);
    host::split(N, host::kRows, [&](index lo, index hi) {
      host::layernorm_backward_dx(dx, dout, x, w, mean, rstd, lo, hi, C, dresid);
    });
    host::split(C, host::kColumns, [&](index lo, index hi) {
      host::layernorm_backward_params(dw, db, dout, x, mean, rstd, N, C, lo, hi);
    });
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct LayerNorm<Meta<D>> {
  template <class A0, class A1, class A2, class A3, class A4, class A5, class... A>
  static void forward(Meta<D>& d, A0, A1, A2, A3, A4, A5, index N, index C, A&&...) {
    d.work.layernorm += 0.5 * static_cast<double>(N) * static_cast<double>(C);
  }
  template <class A0, class A1, class A2, class A3, class A4, class A5, class A6, class A7, class... A>
  static void backward(Meta<D>& d, A0, A1, A2, A3, A4, A5, A6, A7, index N, index C, A&&...) {
    d.work.layernorm += 0.5 * static_cast<double>(N) * static_cast<double>(C);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_LAYERNORM_INSTANCES(EXTERN, T)                                                                      \
  EXTERN template void weft::ops::LayerNorm<weft::Host>::forward<T>(                                                  \
      weft::Host&, T*, weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, const T*, std::int64_t,    \
      std::int64_t, weft::accumulate_t<T>);                                                                           \
  EXTERN template void weft::ops::LayerNorm<weft::Host>::backward<T>(                                                 \
      weft::Host&, T*, weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, const T*,                  \
      const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, std::int64_t, std::int64_t, const T*);              \
  EXTERN template void weft::host::layernorm_forward<T, weft::accumulate_t<T>>(                                       \
      T*, weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, const T*, std::int64_t, std::int64_t,   \
      weft::accumulate_t<T>);                                                                                         \
  EXTERN template void weft::host::layernorm_backward_dx<T, weft::accumulate_t<T>>(                                   \
      T*, const T*, const T*, const T*, const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, std::int64_t,     \
      std::int64_t, std::int64_t, const T*);                                                                          \
  EXTERN template void weft::host::layernorm_backward_params<T, weft::accumulate_t<T>>(                               \
      weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, const weft::accumulate_t<T>*,               \
      const weft::accumulate_t<T>*, std::int64_t, std::int64_t, std::int64_t, std::int64_t);                          \
  EXTERN template void weft::host::layernorm_backward<T, weft::accumulate_t<T>>(                                      \
      T*, weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, const T*, const weft::accumulate_t<T>*, \
      const weft::accumulate_t<T>*, std::int64_t, std::int64_t, const T*);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_LAYERNORM_INSTANCES)
