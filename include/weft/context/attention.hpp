// Causal attention with the sequence sharded over the context axis, on the host, two ways as types:
//
//   context::Ring       keys and values passed around the ring of c ranks (c - 1 steps); each step
//                       attends the local queries to the block it holds, and the partial results
//                       merge by their log-sum-exp. The backward passes the keys and values around
//                       again with their gradients, which end where they started (c steps).
//   context::AllGather  keys and values all-gathered once (Llama 3's choice: simpler, c times the
//                       key-value memory); the backward reduce-scatters their gradients.
//
// Each rank holds T / c rows of the sequence in the chunks of context::Chunks (rank r: chunks r and
// 2c - 1 - r), in the row layout of ops::Attention (H heads of size hd in groups of g sharing a key
// and a value):
//   qkv  (B, T/c, H/g, g + 2, hd)   this rank's rows
//   out  (B, T/c, H, hd)
//   lse  (B, H, T/c)                each query row's log-sum-exp of its scaled scores, in S: what
//                                   the backward needs instead of the (T/c, T) probabilities
// The causal mask is by position in the sequence (Chunks::position), so a block whose keys all lie
// after a query contributes nothing to it. Sums run in S = accumulate_t<T>; in double both types
// equal one rank's ops::Attention to rounding (tests/context/attention.cpp: 1e-12).
//
// Communication per rank, a block being B (T/c) (H/g) 2 hd elements: Ring sends and receives c - 1
// blocks forward, and c - 1 blocks and c gradient blocks (in S) backward; AllGather gathers c - 1
// blocks forward, gathers them again backward (the forward keeps nothing) and reduce-scatters the c
// gradient blocks. The ring's send and receive are ordered by rank parity so that blocking sends
// cannot deadlock; overlapping them with the block's compute (posted sends) is for the GPU version.
// The buffers each call works in come from a Buffers source (below), so that the layers count them
// on their device's allocator: per rank, Ring holds 2 blocks forward and 2 blocks and 2 gradient
// blocks backward; AllGather c + 1 blocks forward and (c + 1) blocks and gradient blocks backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/context/chunks.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"

namespace weft::context {

namespace detail {

// Where head h's query sits in a token's qkv row (ops::Attention's layout).
constexpr index q_at(index h, index hd, index g) { return ((h / g) * (g + 2) + h % g) * hd; }

// kv (B, Tl, H/g, 2, hd): the keys and values of this rank's rows, the block that travels.
template <class T>
void pack_kv(T* kv, const T* qkv, index B, index Tl, index H, index hd, index g) {
  const index G = H / g, row = G * (g + 2) * hd;
  for (index n = 0; n < B * Tl; ++n)
    for (index grp = 0; grp < G; ++grp)
      std::copy_n(qkv + n * row + (grp * (g + 2) + g) * hd, 2 * hd, kv + (n * G + grp) * 2 * hd);
}

// One block: the local queries (positions qpos) against the keys and values of kv (positions kpos),
// merged into the running (o, lse) by log-sum-exp. o (B, Tl, H, hd) and lse (B, H, Tl) in S.
template <class T, class S, class QPos, class KPos>
void block_forward(S* o, S* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd, index g,
                   QPos qpos, KPos kpos) {
  const index G = H / g, row = G * (g + 2) * hd;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  std::vector<S> s(static_cast<std::size_t>(Tl)), ob(static_cast<std::size_t>(hd));
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h)
      for (index i = 0; i < Tl; ++i) {
        const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
        const index p = qpos(i);
        S mx = -std::numeric_limits<S>::infinity();
        for (index j = 0; j < Tl; ++j) {
          if (kpos(j) > p) continue;
          const T* k = kv + ((b * Tl + j) * G + h / g) * 2 * hd;
          S dot = 0;
          for (index d = 0; d < hd; ++d) dot += widen(q[d]) * widen(k[d]);
          s[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        if (mx == -std::numeric_limits<S>::infinity()) continue;  // every key of the block is in the future
        S sum = 0;
        for (index j = 0; j < Tl; ++j)
          if (kpos(j) <= p) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        const S lb = mx + std::log(sum);
        std::fill(ob.begin(), ob.end(), S(0));
        for (index j = 0; j < Tl; ++j) {
          if (kpos(j) > p) continue;
          const S pij = std::exp(s[static_cast<std::size_t>(j)] - lb);
          const T* v = kv + ((b * Tl + j) * G + h / g) * 2 * hd + hd;
          for (index d = 0; d < hd; ++d) ob[static_cast<std::size_t>(d)] += pij * widen(v[d]);
        }
        S& l = lse[(b * H + h) * Tl + i];
        S* oi = o + ((b * Tl + i) * H + h) * hd;
        if (l == -std::numeric_limits<S>::infinity()) {
          std::copy(ob.begin(), ob.end(), oi);
          l = lb;
          continue;
        }
        const S top = std::max(l, lb), merged = top + std::log(std::exp(l - top) + std::exp(lb - top));
        const S wa = std::exp(l - merged), wb = std::exp(lb - merged);
        for (index d = 0; d < hd; ++d) oi[d] = oi[d] * wa + ob[static_cast<std::size_t>(d)] * wb;
        l = merged;
      }
}

// One block's gradients: P_ij = exp(scale q_i k_j - lse_i), dS_ij = P_ij (dout_i v_j - D_i) scale
// with D_i = dout_i out_i; dq_i += dS_ij k_j (dq in the qkv row layout, in S), dk_j += dS_ij q_i and
// dv_j += P_ij dout_i (dkv in the kv layout, in S).
template <class T, class S, class QPos, class KPos>
void block_backward(S* dq, S* dkv, const T* qkv, const T* kv, const T* dout, const S* D, const S* lse, index B,
                    index Tl, index H, index hd, index g, QPos qpos, KPos kpos) {
  const index G = H / g, row = G * (g + 2) * hd;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h)
      for (index i = 0; i < Tl; ++i) {
        const index p = qpos(i);
        const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
        const T* dout_i = dout + ((b * Tl + i) * H + h) * hd;
        S* dq_i = dq + (b * Tl + i) * row + q_at(h, hd, g);
        const S l = lse[(b * H + h) * Tl + i], Di = D[(b * H + h) * Tl + i];
        for (index j = 0; j < Tl; ++j) {
          if (kpos(j) > p) continue;
          const T* k = kv + ((b * Tl + j) * G + h / g) * 2 * hd;
          const T* v = k + hd;
          S* dk = dkv + ((b * Tl + j) * G + h / g) * 2 * hd;
          S* dv = dk + hd;
          S dot = 0, dp = 0;
          for (index d = 0; d < hd; ++d) {
            dot += widen(q[d]) * widen(k[d]);
            dp += widen(dout_i[d]) * widen(v[d]);
          }
          const S pij = std::exp(dot * scale - l), ds = pij * (dp - Di) * scale;
          for (index d = 0; d < hd; ++d) {
            dq_i[d] += ds * widen(k[d]);
            dk[d] += ds * widen(q[d]);
            dv[d] += pij * widen(dout_i[d]);
          }
        }
      }
}

// D (B, H, Tl) = rowsum(dout * out) per head, in S.
template <class T, class S>
void row_dots(S* D, const T* dout, const T* out, index B, index Tl, index H, index hd) {
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h)
      for (index i = 0; i < Tl; ++i) {
        const T* a = dout + ((b * Tl + i) * H + h) * hd;
        const T* c = out + ((b * Tl + i) * H + h) * hd;
        S sum = 0;
        for (index d = 0; d < hd; ++d) sum += widen(a[d]) * widen(c[d]);
        D[(b * H + h) * Tl + i] = sum;
      }
}

// dqkv (T) from dq (the query slots, S) and this rank's own key-value gradients dkv (S).
template <class T, class S>
void write_dqkv(T* dqkv, const S* dq, const S* dkv, index B, index Tl, index H, index hd, index g) {
  const index G = H / g, row = G * (g + 2) * hd;
  for (index n = 0; n < B * Tl; ++n)
    for (index grp = 0; grp < G; ++grp) {
      for (index d = 0; d < g * hd; ++d)
        dqkv[n * row + grp * (g + 2) * hd + d] = narrow<T>(dq[n * row + grp * (g + 2) * hd + d]);
      for (index d = 0; d < 2 * hd; ++d)
        dqkv[n * row + (grp * (g + 2) + g) * hd + d] = narrow<T>(dkv[(n * G + grp) * 2 * hd + d]);
    }
}

// Passes `mine` to the next rank of the ring and receives the previous rank's into `theirs`; even
// ranks send first, odd ranks receive first, so blocking sends always find their receiver.
template <Communicator C, class E>
void ring_shift(C& comm, std::span<const E> mine, std::span<E> theirs) {
  const int r = comm.rank(), c = comm.size(), next = (r + 1) % c, prev = (r + c - 1) % c;
  if (r % 2 == 0) {
    comm.send(mine, next);
    comm.recv(theirs, prev);
  } else {
    comm.recv(theirs, prev);
    comm.send(mine, next);
  }
}

// Zeros o (in S) and sets lse to minus infinity: what a forward merges blocks into.
template <class S>
void start_merge(S* o, S* lse, index B, index Tl, index H, index hd) {
  std::fill(lse, lse + B * H * Tl, -std::numeric_limits<S>::infinity());
  std::fill(o, o + B * Tl * H * hd, S(0));
}
template <class T, class S>
void finish_merge(T* out, const S* o, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = narrow<T>(o[i]);
}

inline void require(const Chunks& ch, int ranks, index Tl, index H, index g, const char* where) {
  if (ch.degree != ranks)
    throw Error(where, cat("chunks of a context degree ", ch.degree, " on a communicator of ", ranks, " ranks"),
                "build the Chunks with the context group's size");
  if (Tl != ch.local())
    throw Error(where, cat(Tl, " local rows where the chunks give each rank ", ch.local(), " (T ", ch.seq, " over ", ch.degree, ")"),
                "pass the rank's T / c rows");
  if (g < 1 || H % g != 0) throw Error(where, cat(H, " heads in groups of ", g), "use a group size that divides the heads");
}

// The sizes every call works with, after the checks: one key-value block (what travels), the
// output and the qkv rows in elements, and the log-sum-exp rows.
struct Sizes {
  int r, c;
  std::size_t block, out, rows, qkv;
  Sizes(const Chunks& ch, int rank, int size, index B, index Tl, index H, index hd, index g, const char* where) : r(rank), c(size) {
    require(ch, size, Tl, H, g, where);
    block = static_cast<std::size_t>(B * Tl * (H / g) * 2 * hd);
    out = static_cast<std::size_t>(B * Tl * H * hd);
    rows = static_cast<std::size_t>(B * H * Tl);
    qkv = static_cast<std::size_t>(B * Tl * (H / g) * (g + 2) * hd);
  }
};

}  // namespace detail

// Where a call's buffers come from (the travelling key-value blocks and their gradients:
// Category::communication; the S accumulators of the output and the gradients:
// Category::activations), and whether it computes. A call takes each buffer once and the source
// keeps them until it is destroyed, so the caller decides how long they live. HostBuffers keeps
// std::vectors of its own (the default); nn/context_attention.hpp takes them from the layer's device
// allocator, so the host allocator and the plan (the Meta device, where compute is false: the same
// buffers and collectives without the arithmetic) count them.
template <class W>
concept Buffers = requires(W& w, std::size_t n) {
  { w.template take<float>(n, Category::activations) } -> std::same_as<float*>;
  { W::compute } -> std::convertible_to<bool>;
};

class HostBuffers {
 public:
  static constexpr bool compute = true;
  template <class E>
  E* take(std::size_t n, Category) {
    auto p = std::make_shared<E[]>(n);
    held_.push_back(p);
    return p.get();
  }

 private:
  std::vector<std::shared_ptr<void>> held_;
};

namespace detail {
// The calls without a buffer source, for an attention type A: A's, with a HostBuffers of their own.
template <class A>
struct HostCalls {
  template <Communicator C, class T, class S = accumulate_t<T>>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd,
                      index g = 1) {
    HostBuffers w;
    A::forward(comm, ch, out, lse, qkv, B, Tl, H, hd, g, w);
  }
  template <Communicator C, class T, class S = accumulate_t<T>>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g = 1) {
    HostBuffers w;
    A::backward(comm, ch, dqkv, dout, out, lse, qkv, B, Tl, H, hd, g, w);
  }
};
}  // namespace detail

// The attention types (one policy per type): how keys and values reach the local queries. Each
// call has a second form without `w` that takes its buffers from a HostBuffers of its own.
struct Ring : detail::HostCalls<Ring> {
  static constexpr const char* name = "ring";
  using HostCalls::backward;
  using HostCalls::forward;

  // out (B, Tl, H, hd) and lse (B, H, Tl) of this rank's rows; comm is the context group, whose
  // rank r holds the chunks ch gives r.
  template <Communicator C, class T, class S, Buffers W>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd, index g,
                      W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::Ring::forward");
    const int r = z.r, c = z.c;
    T* cur = w.template take<T>(z.block, Category::communication);
    T* next = c > 1 ? w.template take<T>(z.block, Category::communication) : nullptr;
    S* o = w.template take<S>(z.out, Category::activations);
    if constexpr (W::compute) {
      detail::pack_kv(cur, qkv, B, Tl, H, hd, g);
      detail::start_merge(o, lse, B, Tl, H, hd);
    }
    for (int step = 0; step < c; ++step) {
      const int src = (r - step + c) % c;  // whose keys and values this rank holds now
      if constexpr (W::compute)
        detail::block_forward(o, lse, qkv, cur, B, Tl, H, hd, g, [&](index i) { return ch.position(r, i); },
                              [&](index j) { return ch.position(src, j); });
      if (step + 1 < c) {
        detail::ring_shift(comm, std::span<const T>(cur, z.block), std::span<T>(next, z.block));
        std::swap(cur, next);
      }
    }
    if constexpr (W::compute) detail::finish_merge(out, o, z.out);
  }

  // dqkv (B, Tl, H/g, g + 2, hd) of this rank's rows from dout and what forward returned.
  template <Communicator C, class T, class S, Buffers W>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g, W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::Ring::backward");
    const int r = z.r, c = z.c;
    T* cur = w.template take<T>(z.block, Category::communication);
    T* next = c > 1 ? w.template take<T>(z.block, Category::communication) : nullptr;
    S* dcur = w.template take<S>(z.block, Category::communication);
    S* dnext = c > 1 ? w.template take<S>(z.block, Category::communication) : nullptr;
    S* dq = w.template take<S>(z.qkv, Category::activations);
    S* D = w.template take<S>(z.rows, Category::activations);
    if constexpr (W::compute) {
      detail::pack_kv(cur, qkv, B, Tl, H, hd, g);
      std::fill(dcur, dcur + z.block, S(0));
      std::fill(dq, dq + z.qkv, S(0));
      detail::row_dots(D, dout, out, B, Tl, H, hd);
    }
    for (int step = 0; step < c; ++step) {
      const int src = (r - step + c) % c;
      if constexpr (W::compute)
        detail::block_backward(dq, dcur, qkv, cur, dout, D, lse, B, Tl, H, hd, g, [&](index i) { return ch.position(r, i); },
                               [&](index j) { return ch.position(src, j); });
      if (c == 1) break;
      // The block and its gradient travel on together; after the last step (where rank r holds rank
      // r + 1's block) the gradient goes once more, home to the rank whose keys and values they are.
      if (step + 1 < c) {
        detail::ring_shift(comm, std::span<const T>(cur, z.block), std::span<T>(next, z.block));
        std::swap(cur, next);
      }
      detail::ring_shift(comm, std::span<const S>(dcur, z.block), std::span<S>(dnext, z.block));
      std::swap(dcur, dnext);
    }
    if constexpr (W::compute) detail::write_dqkv(dqkv, dq, dcur, B, Tl, H, hd, g);
  }
};

struct AllGather : detail::HostCalls<AllGather> {
  static constexpr const char* name = "all-gather";
  using HostCalls::backward;
  using HostCalls::forward;

  template <Communicator C, class T, class S, Buffers W>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd, index g,
                      W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::AllGather::forward");
    const int r = z.r, c = z.c;
    const std::size_t all_n = z.block * static_cast<std::size_t>(c);
    T* mine = w.template take<T>(z.block, Category::communication);
    T* all = w.template take<T>(all_n, Category::communication);
    S* o = w.template take<S>(z.out, Category::activations);
    if constexpr (W::compute) detail::pack_kv(mine, qkv, B, Tl, H, hd, g);
    comm.all_gather(std::span<const T>(mine, z.block), std::span<T>(all, all_n));  // rank k's block at k * block
    if constexpr (W::compute) {
      detail::start_merge(o, lse, B, Tl, H, hd);
      for (int src = 0; src < c; ++src)
        detail::block_forward(o, lse, qkv, all + static_cast<std::size_t>(src) * z.block, B, Tl, H, hd, g,
                              [&](index i) { return ch.position(r, i); }, [&](index j) { return ch.position(src, j); });
      detail::finish_merge(out, o, z.out);
    }
  }

  template <Communicator C, class T, class S, Buffers W>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g, W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::AllGather::backward");
    const int r = z.r, c = z.c;
    const std::size_t all_n = z.block * static_cast<std::size_t>(c);
    T* mine = w.template take<T>(z.block, Category::communication);
    T* all = w.template take<T>(all_n, Category::communication);
    S* dall = w.template take<S>(all_n, Category::communication);
    S* dmine = w.template take<S>(z.block, Category::communication);
    S* dq = w.template take<S>(z.qkv, Category::activations);
    S* D = w.template take<S>(z.rows, Category::activations);
    if constexpr (W::compute) detail::pack_kv(mine, qkv, B, Tl, H, hd, g);
    comm.all_gather(std::span<const T>(mine, z.block), std::span<T>(all, all_n));  // again: the forward kept none
    if constexpr (W::compute) {
      std::fill(dall, dall + all_n, S(0));
      std::fill(dq, dq + z.qkv, S(0));
      detail::row_dots(D, dout, out, B, Tl, H, hd);
      for (int src = 0; src < c; ++src)
        detail::block_backward(dq, dall + static_cast<std::size_t>(src) * z.block, qkv, all + static_cast<std::size_t>(src) * z.block,
                               dout, D, lse, B, Tl, H, hd, g, [&](index i) { return ch.position(r, i); },
                               [&](index j) { return ch.position(src, j); });
    }
    comm.reduce_scatter(std::span<const S>(dall, all_n), std::span<S>(dmine, z.block), ReduceOp::sum);
    if constexpr (W::compute) detail::write_dqkv(dqkv, dq, dmine, B, Tl, H, hd, g);
  }
};

// The causal attention FLOPs of rank r's queries over the whole sequence (QK^T and PV over the
// pairs its rows see: 4 B H hd pairs forward, twice that backward, as ops::Attention's count), for
// the time model on the Meta device.
inline double forward_flops(const Chunks& ch, int r, index B, index H, index hd) {
  double pairs = 0;
  for (index t = 0; t < ch.local(); ++t) pairs += static_cast<double>(ch.position(r, t) + 1);
  return 4.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(hd) * pairs;
}

template <class A>
concept Kind = std::same_as<A, Ring> || std::same_as<A, AllGather>;

// No context parallelism: a layer's choice (nn::GroupedQueryAttention's Cx) where the sequence is
// whole on every rank.
struct None {
  static constexpr const char* name = "none";
};
template <class A>
concept Choice = std::same_as<A, None> || Kind<A>;

}  // namespace weft::context
