// ops::Embedding and ops::Position: the vocab-parallel lookup (rows [begin, end) held here) and its gradient;
// learned positions t0 .. t0 + Tl - 1 added to the stream, and their gradient.
//
//   Embedding forward:   out (N, C) = table[token - begin] for tokens in [begin, end), else 0
//   Embedding backward:  dtable[token - begin] += dout, rows in order
//   Position forward:    x (B, Tl, C) += table[t] for the rank's positions t (ops::Positions)
//   Position backward:   dtable[t] += sum over the batch of dy
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in embedding.cuh.
// Layers call ops::Embedding<D>::forward(dev, ...).
//
// defines: ops::Embedding (Host, Meta), ops::Position (Host, Meta), host::position_forward,
//   host::position_backward, host::embedding_forward, host::embedding_backward
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
#include "weft/ops/positions.hpp"

namespace weft::host {

// Learned positions: x (B, Tl, C) += the table's rows at this rank's positions (ops::Positions:
// t0 .. t0 + Tl - 1, or a context rank's two chunks).
template <class T>
void position_forward(T* x, const T* table, index B, index Tl, index C, ops::Positions pos) {
  for (index b = 0; b < B; ++b)
    for (index t = 0; t < Tl; ++t)
      for (index c = 0; c < C; ++c) {
        T& e = x[(b * Tl + t) * C + c];
        e = narrow<T>(widen(e) + widen(table[pos.at(t) * C + c]));
      }
}

// dtable's rows at the positions += dy (B, Tl, C), summed over the batch in order.
template <class T, class S = accumulate_t<T>>
void position_backward(S* dtable, const T* dy, index B, index Tl, index C, ops::Positions pos) {
  for (index b = 0; b < B; ++b)
    for (index t = 0; t < Tl; ++t)
      for (index c = 0; c < C; ++c) dtable[pos.at(t) * C + c] += widen(dy[(b * Tl + t) * C + c]);
}

// Vocab-parallel embedding lookup: rows [begin, end) of the vocabulary live here as table
// (end - begin, C). out (N, C) gets the row of each token in range and zeros otherwise, so the sum
// over the ranks of the axis is the full lookup (out is Partial).
template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* table, index N, index C, index begin, index end) {
  for (index n = 0; n < N; ++n) {
    const index t = tokens[n];
    if (t >= begin && t < end) std::copy(table + (t - begin) * C, table + (t - begin + 1) * C, out + n * C);
    else std::fill(out + n * C, out + (n + 1) * C, narrow<T>(accumulate_t<T>(0)));
  }
}

// dtable += the rows of dout for tokens in [begin, end); serial in token order (deterministic).
template <class T, class S = accumulate_t<T>>
void embedding_backward(S* dtable, const T* dout, const std::int32_t* tokens, index N, index C, index begin,
                        index end) {
  for (index n = 0; n < N; ++n) {
    const index t = tokens[n];
    if (t < begin || t >= end) continue;
    S* row = dtable + (t - begin) * C;
    for (index c = 0; c < C; ++c) row[c] += widen(dout[n * C + c]);
  }
}

}  // namespace weft::host

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

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct Embedding<Meta<D>> : MetaPass<D> {};

template <class D>
struct Position<Meta<D>> : MetaPass<D> {};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_EMBEDDING_INSTANCES(EXTERN, T)                                                                       \
  EXTERN template void weft::ops::Embedding<weft::Host>::forward<T>(                                                   \
      weft::Host&, T*, const std::int32_t*, const T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t);         \
  EXTERN template void weft::ops::Embedding<weft::Host>::backward<T>(weft::Host&, weft::accumulate_t<T>*, const T*,    \
                                                                     const std::int32_t*, std::int64_t, std::int64_t,  \
                                                                     std::int64_t, std::int64_t);                      \
  EXTERN template void weft::ops::Position<weft::Host>::forward<T>(weft::Host&, T*, const T*, std::int64_t,            \
                                                                   std::int64_t, std::int64_t, weft::ops::Positions);  \
  EXTERN template void weft::ops::Position<weft::Host>::backward<T>(                                                   \
      weft::Host&, weft::accumulate_t<T>*, const T*, std::int64_t, std::int64_t, std::int64_t, weft::ops::Positions);  \
  EXTERN template void weft::host::position_forward<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t,         \
                                                       weft::ops::Positions);                                          \
  EXTERN template void weft::host::position_backward<T, weft::accumulate_t<T>>(                                        \
      weft::accumulate_t<T>*, const T*, std::int64_t, std::int64_t, std::int64_t, weft::ops::Positions);               \
  EXTERN template void weft::host::embedding_forward<T>(T*, const std::int32_t*, const T*, std::int64_t, std::int64_t, \
                                                        std::int64_t, std::int64_t);                                   \
  EXTERN template void weft::host::embedding_backward<T, weft::accumulate_t<T>>(                                       \
      weft::accumulate_t<T>*, const T*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_EMBEDDING_INSTANCES)
