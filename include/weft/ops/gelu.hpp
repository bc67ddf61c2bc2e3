// ops::Gelu: the GELU (tanh approximation) and its gradient.
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in gelu.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::Gelu<D>::forward(dev, ...).
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

}  // namespace weft::ops
