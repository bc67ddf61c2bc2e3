// ops::Attention: causal attention over H local heads of size hd in groups of g heads that share a key
// and a value (grouped-query attention; g = 1 is GPT-2's multi-head attention). Each token's qkv row
// is (H/g, g + 2, hd): a group's g queries, then its key and its value (for g = 1, (H, {q, k, v}, hd));
// out (B, T, H, hd); probs (B, H, T, T) kept for backward.
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
  // Causal attention over H local heads of size hd in groups of g; probs (B, H, T, T).
  template <class T>
  static void forward(Host&, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1) {
    const host::Timed timed(host::Op::attention);
    const index row = (H / g) * (g + 2) * hd, orow = H * hd;  // one token's qkv, one token's output
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_forward(out + lo * Tn * orow, probs + lo * H * Tn * Tn, qkv + lo * Tn * row, hi - lo, Tn, H, hd, g);
    });
  }

  template <class T>
  static void backward(Host&, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                       index hd, index g = 1) {
    const host::Timed timed(host::Op::attention);
    const index row = (H / g) * (g + 2) * hd, orow = H * hd;
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_backward(dqkv + lo * Tn * row, dout + lo * Tn * orow, qkv + lo * Tn * row,
                               probs + lo * H * Tn * Tn, hi - lo, Tn, H, hd, g);
    });
  }
};

}  // namespace weft::ops
