// ops::Attention: causal attention over H local heads of size hd in GPT-2's fused-qkv layout: each token's
// row is (head, {q, k, v}, hd); probs (B, H, T, T) kept for backward.
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in attention.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::Attention<D>::forward(dev, ...).
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
struct Attention;

template <>
struct Attention<Host> {
  // Causal attention over H local heads of size hd; probs (B, H, T, T).
  template <class T>
  static void forward(Host&, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd) {
    const host::Timed timed(host::Op::attention);
    const index row = H * 3 * hd, orow = H * hd;  // one token's qkv, one token's output
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_forward(out + lo * Tn * orow, probs + lo * H * Tn * Tn, qkv + lo * Tn * row, hi - lo, Tn, H, hd);
    });
  }

  template <class T>
  static void backward(Host&, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                       index hd) {
    const host::Timed timed(host::Op::attention);
    const index row = H * 3 * hd, orow = H * hd;
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_backward(dqkv + lo * Tn * row, dout + lo * Tn * orow, qkv + lo * Tn * row,
                               probs + lo * H * Tn * Tn, hi - lo, Tn, H, hd);
    });
  }
};

}  // namespace weft::ops
