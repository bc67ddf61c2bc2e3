// ops::LayerNorm: LayerNorm over rows of C, mean and rstd saved for backward; the backward adds the residual
// stream's gradient (dresid) into dx where given.
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in layernorm.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::LayerNorm<D>::forward(dev, ...).
#pragma once

#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/ops/family.hpp"

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

}  // namespace weft::ops
