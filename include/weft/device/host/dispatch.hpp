// Ops<Host>: the host back end's operations behind the dispatch point (device/ops.hpp), each
// forwarding to the reference op of the same name (gemm.hpp, ops.hpp). Shapes are row-major; N is
// a number of rows (positions), C a row's length.
#pragma once

#include <cstring>

#include "weft/device/host/gemm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/ops.hpp"

namespace weft {

template <>
struct Ops<Host> {
  using index = std::int64_t;

  // C (m, n) = alpha op(A) op(B) + beta C (see host::gemm).
  template <class T>
  static void gemm(Host&, Trans ta, Trans tb, index m, index n, index k, T alpha, const T* a, index lda, const T* b,
                   index ldb, T beta, T* c, index ldc) {
    host::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  // Memory: n elements set to zero; n elements copied (the ranges do not overlap).
  template <class T>
  static void zero(Host&, T* out, index n) {
    if (n > 0) std::memset(static_cast<void*>(out), 0, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class T>
  static void copy(Host&, T* out, const T* in, index n) {
    if (n > 0) std::memcpy(static_cast<void*>(out), in, static_cast<std::size_t>(n) * sizeof(T));
  }

  // Parameter initialization (see host::init_normal): a constant, or normal draws keyed by each
  // element's global index in the rank's box (offset) of the global tensor.
  template <class T>
  static void fill(Host&, T* out, index n, T v) { host::fill(out, n, v); }
  template <class T>
  static void init_normal(Host&, T* out, const Shape& global, const Shape& local, const Shape& offset,
                          std::uint64_t seed, std::uint64_t id, double std) {
    host::init_normal(out, global, local, offset, seed, id, std);
  }

  // Elementwise: out += x; the GELU and its gradient; a bias on every row and its gradient.
  template <class T>
  static void add_inplace(Host&, T* out, const T* x, index n) { host::add_inplace(out, x, n); }
  template <class T>
  static void gelu_forward(Host&, T* out, const T* x, index n) { host::gelu_forward(out, x, n); }
  template <class T>
  static void gelu_backward(Host&, T* dx, const T* x, const T* dout, index n) { host::gelu_backward(dx, x, dout, n); }
  template <class T>
  static void bias_add(Host&, T* y, const T* b, index N, index C) { host::bias_add(y, b, N, C); }
  template <class T>
  static void bias_backward(Host&, T* db, const T* dy, index N, index C) { host::bias_backward(db, dy, N, C); }

  // LayerNorm over rows of C: mean and rstd (N) saved for backward.
  template <class T>
  static void layernorm_forward(Host&, T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, index N, index C,
                                T eps) {
    host::layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
  }
  template <class T>
  static void layernorm_backward(Host&, T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                                 const T* rstd, index N, index C) {
    host::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
  }

  // Causal attention over H local heads of size hd; probs (B, H, T, T).
  template <class T>
  static void attention_forward(Host&, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd) {
    host::attention_forward(out, probs, qkv, B, Tn, H, hd);
  }
  template <class T>
  static void attention_backward(Host&, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn,
                                 index H, index hd) {
    host::attention_backward(dqkv, dout, qkv, probs, B, Tn, H, hd);
  }

  // Embeddings: vocabulary rows [begin, end) held here; positions t0 .. t0 + Tl - 1.
  template <class T>
  static void embedding_forward(Host&, T* out, const std::int32_t* tokens, const T* table, index N, index C,
                                index begin, index end) {
    host::embedding_forward(out, tokens, table, N, C, begin, end);
  }
  template <class T>
  static void embedding_backward(Host&, T* dtable, const T* dout, const std::int32_t* tokens, index N, index C,
                                 index begin, index end) {
    host::embedding_backward(dtable, dout, tokens, N, C, begin, end);
  }
  template <class T>
  static void position_forward(Host&, T* x, const T* table, index B, index Tl, index C, index t0) {
    host::position_forward(x, table, B, Tl, C, t0);
  }
  template <class T>
  static void position_backward(Host&, T* dtable, const T* dy, index B, index Tl, index C, index t0) {
    host::position_backward(dtable, dy, B, Tl, C, t0);
  }

  // Vocab-parallel cross-entropy over logits (N, V) with `valid` real columns from `begin`.
  template <class T>
  static void ce_row_max(Host&, T* rowmax, const T* logits, index N, index V, index valid) {
    host::ce_row_max(rowmax, logits, N, V, valid);
  }
  template <class T>
  static void ce_row_stats(Host&, T* stats, const T* logits, const T* rowmax, const std::int32_t* targets, index N,
                           index V, index valid, index begin) {
    host::ce_row_stats(stats, logits, rowmax, targets, N, V, valid, begin);
  }
  template <class T>
  static void ce_backward(Host&, T* dlogits, const T* logits, const T* rowmax, const T* sumexp,
                          const std::int32_t* targets, index N, index V, index valid, index begin, T scale) {
    host::ce_backward(dlogits, logits, rowmax, sumexp, targets, N, V, valid, begin, scale);
  }

  // The optimizer's: updates over n elements with the gradient scaled by grad_scale, and the sum
  // of squares (in double) behind the global norm.
  template <class P, class S>
  static void adamw(Host&, P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay,
                    double grad_scale) {
    host::adamw(p, g, m, v, n, a, decay, grad_scale);
  }
  template <class P, class S>
  static void sgd(Host&, P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay, bool decay,
                  double grad_scale) {
    host::sgd(p, g, buf, n, lr, momentum, weight_decay, decay, grad_scale);
  }
  template <class T>
  static double sum_squares(Host&, const T* x, index n) { return host::sum_squares(x, n); }
};

}  // namespace weft
