// ops::CrossEntropy: the vocab-parallel cross-entropy over logits (N, V) with `valid` real columns from `begin`:
// row maxima, row statistics (sum of exp, target logit), the loss sum, and the gradient.
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in cross_entropy.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::CrossEntropy<D>::row_max(dev, ...).
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
struct CrossEntropy;

template <>
struct CrossEntropy<Host> {
  // Vocab-parallel cross-entropy over logits (N, V) with `valid` real columns from `begin`; the loss
  // sum over the rows comes back to the host.
  template <class T>
  static void row_max(Host&, acc<T>* rowmax, const T* logits, index N, index V, index valid) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, host::kRows,
                [&](index lo, index hi) { host::ce_row_max(rowmax + lo, logits + lo * V, hi - lo, V, valid); });
  }

  template <class T>
  static void row_stats(Host&, acc<T>* stats, const T* logits, const acc<T>* rowmax, const std::int32_t* targets,
                        index N, index V, index valid, index begin) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, host::kRows, [&](index lo, index hi) {
      host::ce_row_stats(stats + 2 * lo, logits + lo * V, rowmax + lo, targets + lo, hi - lo, V, valid, begin);
    });
  }

  template <class S>
  static double loss(Host&, S* sumexp, const S* stats, const S* rowmax, index N) {
    const host::Timed timed(host::Op::cross_entropy);
    return host::ce_loss(sumexp, stats, rowmax, N);
  }

  template <class T>
  static void backward(Host&, T* dlogits, const T* logits, const acc<T>* rowmax, const acc<T>* sumexp,
                       const std::int32_t* targets, index N, index V, index valid, index begin, acc<T> scale) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, host::kRows, [&](index lo, index hi) {
      host::ce_backward(dlogits + lo * V, logits + lo * V, rowmax + lo, sumexp + lo, targets + lo, hi - lo, V, valid,
                        begin, scale);
    });
  }
};

}  // namespace weft::ops
