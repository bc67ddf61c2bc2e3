// ops::Embedding and ops::Position: the vocab-parallel lookup (rows [begin, end) held here) and its gradient;
// learned positions t0 .. t0 + Tl - 1 added to the stream, and their gradient.
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in embedding.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::Embedding<D>::forward(dev, ...).
#pragma once

#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/ops/family.hpp"
#include "weft/ops/positions.hpp"

namespace weft::ops {

template <class D>
struct Embedding;

template <class D>
struct Position;

template <>
struct Embedding<Host> {
  // Embeddings: vocabulary rows [begin, end) held here.
  template <class T>
  static void forward(Host&, T* out, const std::int32_t* tokens, const T* table, index N, index C, index begin,
                      index end) {
    const host::Timed timed(host::Op::embedding);
    host::embedding_forward(out, tokens, table, N, C, begin, end);
  }

  template <class T>
  static void backward(Host&, acc<T>* dtable, const T* dout, const std::int32_t* tokens, index N, index C, index begin,
                       index end) {
    const host::Timed timed(host::Op::embedding);
    host::embedding_backward(dtable, dout, tokens, N, C, begin, end);
  }
};

// Learned positions: x (B, Tl, C) += the table's rows at the positions of its Tl rows (ops::Positions:
// t0 .. t0 + Tl - 1 for a sequence-parallel rank's slice, or a context rank's two chunks).
template <>
struct Position<Host> {
  template <class T>
  static void forward(Host&, T* x, const T* table, index B, index Tl, index C, Positions pos) {
    const host::Timed timed(host::Op::embedding);
    host::position_forward(x, table, B, Tl, C, pos);
  }

  template <class T>
  static void backward(Host&, acc<T>* dtable, const T* dy, index B, index Tl, index C, Positions pos) {
    const host::Timed timed(host::Op::embedding);
    host::position_backward(dtable, dy, B, Tl, C, pos);
  }
};

}  // namespace weft::ops
