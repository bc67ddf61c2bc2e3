// ops::Bias: a bias on every row, and its gradient (a column sum).
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in bias.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::Bias<D>::add(dev, ...).
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

}  // namespace weft::ops
