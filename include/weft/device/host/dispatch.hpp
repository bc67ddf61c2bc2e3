// Ops<Host>: the host back end's operations behind the dispatch point (device/ops.hpp), each
// forwarding to the reference op of the same name (gemm.hpp, ops.hpp). Shapes are row-major; N is
// a number of rows (positions), C a row's length.
//
// T is the compute type (double, float, bf16) and S = accumulate_t<T> the type of parameter
// gradients, statistics and master weights (core/precision.hpp); the Cuda specialization has the
// same signatures. Each op adds its time to the thread's host::OpTimes when one is set
// (profile.hpp), by op class.
//
// With host::set_threads (a lone rank's cores, device/host/workers.hpp), GEMMs split their rows
// (gemm.hpp) and the heavy elementwise and row ops split here, over rows, sequences, columns or
// chunk-aligned ranges: every element is computed as on one thread, so the bits do not depend on
// the number of threads (tests/device/host/workers.cpp checks each op).
#pragma once

#include <algorithm>
#include <cstring>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "weft/device/host/gemm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/ops.hpp"

namespace weft {

template <>
struct Ops<Host> {
  using index = std::int64_t;
  template <class T> using acc = accumulate_t<T>;

  // C (m, n) = alpha op(A) op(B) + beta C (see host::gemm): A and B in T, C in T or in acc<T> (the
  // parameter gradients of bf16 compute), accumulated in acc<T> and rounded once into C.
  template <class T, class C>
  static void gemm(Host&, Trans ta, Trans tb, index m, index n, index k, acc<T> alpha, const T* a, index lda,
                   const T* b, index ldb, acc<T> beta, C* c, index ldc) {
    static_assert(std::same_as<C, T> || std::same_as<C, acc<T>>, "Ops<Host>::gemm: C must be T or accumulate_t<T>");
    const host::Timed timed(host::Op::gemm);
    if constexpr (std::same_as<T, acc<T>>) {
      host::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {  // bf16 operands: widen, multiply in float, round once where C is bf16
      auto extent = [](index rows, index ld, index cols) { return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0; };
      const std::vector<float> wa = widened(a, ta == Trans::yes ? extent(k, lda, m) : extent(m, lda, k));
      const std::vector<float> wb = widened(b, tb == Trans::yes ? extent(n, ldb, k) : extent(k, ldb, n));
      if constexpr (std::same_as<C, float>) {
        host::gemm<float>(ta, tb, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, c, ldc);
      } else {
        std::vector<float> wc = widened(c, beta == 0.0f ? 0 : extent(m, ldc, n));
        wc.resize(static_cast<std::size_t>(m * ldc));
        host::gemm<float>(ta, tb, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, wc.data(), ldc);
        for (index i = 0; i < m; ++i)
          for (index j = 0; j < n; ++j) c[i * ldc + j] = bf16(wc[static_cast<std::size_t>(i * ldc + j)]);
      }
    }
  }

  // Memory: n elements set to zero; n elements copied (the ranges do not overlap); n elements
  // converted (master weights rounded to the compute type).
  template <class T>
  static void zero(Host&, T* out, index n) {
    const host::Timed timed(host::Op::memory);
    if (n > 0) std::memset(static_cast<void*>(out), 0, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class T>
  static void copy(Host&, T* out, const T* in, index n) {
    const host::Timed timed(host::Op::memory);
    if (n > 0) std::memcpy(static_cast<void*>(out), in, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class To, class From>
  static void convert(Host&, To* out, const From* in, index n) {
    const host::Timed timed(host::Op::memory);
    host::convert(out, in, n);
  }

  // Parameter initialization (see host::init_normal): a constant, or normal draws keyed by each
  // element's global index in the rank's box (offset) of the global tensor.
  template <class T>
  static void fill(Host&, T* out, index n, T v) {
    const host::Timed timed(host::Op::memory);
    host::fill(out, n, v);
  }
  template <class T>
  static void init_normal(Host&, T* out, const Shape& global, const Shape& local, const Shape& offset,
                          std::uint64_t seed, std::uint64_t id, double std) {
    const host::Timed timed(host::Op::memory);
    host::init_normal(out, global, local, offset, seed, id, std);
  }

  // Elementwise: out += x; the GELU and its gradient; a bias on every row and its gradient.
  template <class T>
  static void add_inplace(Host&, T* out, const T* x, index n) {
    const host::Timed timed(host::Op::elementwise);
    host::split(n, kElements, [&](index lo, index hi) { host::add_inplace(out + lo, x + lo, hi - lo); });
  }
  template <class T>
  static void gelu_forward(Host&, T* out, const T* x, index n) {
    const host::Timed timed(host::Op::gelu);
    host::split(n, kElements, [&](index lo, index hi) { host::gelu_forward(out + lo, x + lo, hi - lo); });
  }
  template <class T>
  static void gelu_backward(Host&, T* dx, const T* x, const T* dout, index n) {
    const host::Timed timed(host::Op::gelu);
    host::split(n, kElements, [&](index lo, index hi) { host::gelu_backward(dx + lo, x + lo, dout + lo, hi - lo); });
  }
  template <class T>
  static void bias_add(Host&, T* y, const T* b, index N, index C) {
    const host::Timed timed(host::Op::elementwise);
    host::split(N, kRows, [&](index lo, index hi) { host::bias_add(y + lo * C, b, hi - lo, C); });
  }
  template <class T>
  static void bias_backward(Host&, acc<T>* db, const T* dy, index N, index C) {
    const host::Timed timed(host::Op::elementwise);
    host::bias_backward(db, dy, N, C);
  }

  // LayerNorm over rows of C: mean and rstd (N) saved for backward. The backward adds dresid (the
  // residual stream's gradient) into dx when it is not null.
  template <class T>
  static void layernorm_forward(Host&, T* out, acc<T>* mean, acc<T>* rstd, const T* x, const T* w, const T* b, index N,
                                index C, acc<T> eps) {
    const host::Timed timed(host::Op::layernorm);
    host::split(N, kRows, [&](index lo, index hi) {
      host::layernorm_forward(out + lo * C, mean + lo, rstd + lo, x + lo * C, w, b, hi - lo, C, eps);
    });
  }
  template <class T>
  static void layernorm_backward(Host&, T* dx, acc<T>* dw, acc<T>* db, const T* dout, const T* x, const T* w,
                                 const acc<T>* mean, const acc<T>* rstd, index N, index C, const T* dresid = nullptr) {
    const host::Timed timed(host::Op::layernorm);
    host::split(N, kRows, [&](index lo, index hi) {
      host::layernorm_backward_dx(dx, dout, x, w, mean, rstd, lo, hi, C, dresid);
    });
    host::split(C, kColumns, [&](index lo, index hi) {
      host::layernorm_backward_params(dw, db, dout, x, mean, rstd, N, C, lo, hi);
    });
  }

  // Causal attention over H local heads of size hd; probs (B, H, T, T).
  template <class T>
  static void attention_forward(Host&, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd) {
    const host::Timed timed(host::Op::attention);
    const index row = H * 3 * hd, orow = H * hd;  // one token's qkv, one token's output
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_forward(out + lo * Tn * orow, probs + lo * H * Tn * Tn, qkv + lo * Tn * row, hi - lo, Tn, H, hd);
    });
  }
  template <class T>
  static void attention_backward(Host&, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn,
                                 index H, index hd) {
    const host::Timed timed(host::Op::attention);
    const index row = H * 3 * hd, orow = H * hd;
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_backward(dqkv + lo * Tn * row, dout + lo * Tn * orow, qkv + lo * Tn * row,
                               probs + lo * H * Tn * Tn, hi - lo, Tn, H, hd);
    });
  }

  // Embeddings: vocabulary rows [begin, end) held here; positions t0 .. t0 + Tl - 1.
  template <class T>
  static void embedding_forward(Host&, T* out, const std::int32_t* tokens, const T* table, index N, index C,
                                index begin, index end) {
    const host::Timed timed(host::Op::embedding);
    host::embedding_forward(out, tokens, table, N, C, begin, end);
  }
  template <class T>
  static void embedding_backward(Host&, acc<T>* dtable, const T* dout, const std::int32_t* tokens, index N, index C,
                                 index begin, index end) {
    const host::Timed timed(host::Op::embedding);
    host::embedding_backward(dtable, dout, tokens, N, C, begin, end);
  }
  template <class T>
  static void position_forward(Host&, T* x, const T* table, index B, index Tl, index C, index t0) {
    const host::Timed timed(host::Op::embedding);
    host::position_forward(x, table, B, Tl, C, t0);
  }
  template <class T>
  static void position_backward(Host&, acc<T>* dtable, const T* dy, index B, index Tl, index C, index t0) {
    const host::Timed timed(host::Op::embedding);
    host::position_backward(dtable, dy, B, Tl, C, t0);
  }

  // Vocab-parallel cross-entropy over logits (N, V) with `valid` real columns from `begin`; the loss
  // sum over the rows comes back to the host.
  template <class T>
  static void ce_row_max(Host&, acc<T>* rowmax, const T* logits, index N, index V, index valid) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, kRows, [&](index lo, index hi) { host::ce_row_max(rowmax + lo, logits + lo * V, hi - lo, V, valid); });
  }
  template <class T>
  static void ce_row_stats(Host&, acc<T>* stats, const T* logits, const acc<T>* rowmax, const std::int32_t* targets,
                           index N, index V, index valid, index begin) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, kRows, [&](index lo, index hi) {
      host::ce_row_stats(stats + 2 * lo, logits + lo * V, rowmax + lo, targets + lo, hi - lo, V, valid, begin);
    });
  }
  template <class S>
  static double ce_loss(Host&, S* sumexp, const S* stats, const S* rowmax, index N) {
    const host::Timed timed(host::Op::cross_entropy);
    return host::ce_loss(sumexp, stats, rowmax, N);
  }
  template <class T>
  static void ce_backward(Host&, T* dlogits, const T* logits, const acc<T>* rowmax, const acc<T>* sumexp,
                          const std::int32_t* targets, index N, index V, index valid, index begin, acc<T> scale) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, kRows, [&](index lo, index hi) {
      host::ce_backward(dlogits + lo * V, logits + lo * V, rowmax + lo, sumexp + lo, targets + lo, hi - lo, V, valid,
                        begin, scale);
    });
  }

  // The optimizer's: updates over n elements with the gradient scaled by grad_scale, and the sum
  // of squares (in double) behind the global norm.
  template <class P, class S>
  static void adamw(Host&, P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay,
                    double grad_scale) {
    const host::Timed timed(host::Op::optimizer);
    host::split(n, kElements, [&](index lo, index hi) {
      host::adamw(p + lo, g + lo, m + lo, v + lo, hi - lo, a, decay, grad_scale);
    });
  }
  template <class P, class S>
  static void sgd(Host&, P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay, bool decay,
                  double grad_scale) {
    const host::Timed timed(host::Op::optimizer);
    host::sgd(p, g, buf, n, lr, momentum, weight_decay, decay, grad_scale);
  }
  template <class T>
  static double sum_squares(Host&, const T* x, index n) {
    const host::Timed timed(host::Op::norm);
    return host::sum_squares(x, n);
  }
  // Several ranges, each cut into blocks of kElements from its start: every block's sum of squares
  // (host::sum_squares), then the blocks' sums added in order, ranges in order. The blocks are
  // fixed by the sizes alone, so the threads that run them do not change the bits.
  template <class T>
  static double sum_squares_many(Host&, std::span<const std::pair<const T*, index>> pieces) {
    const host::Timed timed(host::Op::norm);
    std::vector<std::pair<const T*, index>> blocks;
    for (const auto& [p, n] : pieces)
      for (index lo = 0; lo < n; lo += kElements) blocks.emplace_back(p + lo, std::min(kElements, n - lo));
    std::vector<double> sums(blocks.size());
    host::parallel(static_cast<index>(blocks.size()), [&](index b) {
      const auto& [p, n] = blocks[static_cast<std::size_t>(b)];
      sums[static_cast<std::size_t>(b)] = host::sum_squares(p, n);
    });
    double s = 0;
    for (double x : sums) s += x;
    return s;
  }
  // AdamW over several ranges (Piece in optim/optimizer.hpp: p, g, state {m, v}, n, decay).
  template <class Pieces, class S>
  static void adamw_many(Host&, const Pieces& pieces, const math::AdamWParams<S>& a, double grad_scale) {
    const host::Timed timed(host::Op::optimizer);
    if (host::threads() == 1) {
      for (const auto& x : pieces) host::adamw(x.p, x.g, x.state[0], x.state[1], x.n, a, x.decay, grad_scale);
      return;
    }
    // Every piece cut into ranges of kElements, the ranges dealt out to the threads.
    struct Range {
      std::size_t piece;
      index lo, hi;
    };
    std::vector<Range> ranges;
    for (std::size_t i = 0; i < std::size(pieces); ++i)
      for (index lo = 0; lo < pieces[i].n; lo += kElements) ranges.push_back({i, lo, std::min(pieces[i].n, lo + kElements)});
    host::parallel(static_cast<index>(ranges.size()), [&](index r) {
      const Range& q = ranges[static_cast<std::size_t>(r)];
      const auto& x = pieces[q.piece];
      host::adamw(x.p + q.lo, x.g + q.lo, x.state[0] + q.lo, x.state[1] + q.lo, q.hi - q.lo, a, x.decay, grad_scale);
    });
  }

 private:
  // The smallest parts worth a thread: elements of elementwise ops (a multiple of the float fast
  // paths' chunks, host::detail::kChunk, so every chunk starts where it does on one thread), rows
  // of row ops, columns of column sums.
  static constexpr index kElements = 16384, kRows = 16, kColumns = 64;
  static_assert(kElements % host::detail::kChunk == 0);

  template <class T>
  static std::vector<float> widened(const T* p, index n) {
    std::vector<float> w(static_cast<std::size_t>(n));
    for (index i = 0; i < n; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(p[i]);
    return w;
  }
};

}  // namespace weft
