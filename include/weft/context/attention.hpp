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
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/context/chunks.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"

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

// The running output (zeros, in S) and log-sum-exp (minus infinity) that a forward merges blocks
// into, and the output's narrowing at the end.
template <class S>
std::vector<S> start_merge(S* lse, index B, index Tl, index H, index hd) {
  std::fill(lse, lse + B * H * Tl, -std::numeric_limits<S>::infinity());
  return std::vector<S>(static_cast<std::size_t>(B * Tl * H * hd), S(0));
}
template <class T, class S>
void finish_merge(T* out, const std::vector<S>& o) {
  for (std::size_t i = 0; i < o.size(); ++i) out[i] = narrow<T>(o[i]);
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

// What each call starts from: the checks, this rank and the group's size, one block's elements and
// this rank's own keys and values packed as a block.
template <class T>
struct Local {
  int r, c;
  std::size_t block;
  std::vector<T> kv;
  Local(const Chunks& ch, int rank, int size, const T* qkv, index B, index Tl, index H, index hd, index g, const char* where)
      : r(rank), c(size), block(static_cast<std::size_t>(B * Tl * (H / (g < 1 ? 1 : g)) * 2 * hd)) {
    require(ch, size, Tl, H, g, where);
    kv.resize(block);
    pack_kv(kv.data(), qkv, B, Tl, H, hd, g);
  }
};

}  // namespace detail

// The attention types (one policy per type): how keys and values reach the local queries.
struct Ring {
  static constexpr const char* name = "ring";

  // out (B, Tl, H, hd) and lse (B, H, Tl) of this rank's rows; comm is the context group, whose
  // rank r holds the chunks ch gives r.
  template <Communicator C, class T, class S = accumulate_t<T>>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd,
                      index g = 1) {
    detail::Local<T> me(ch, comm.rank(), comm.size(), qkv, B, Tl, H, hd, g, "context::Ring::forward");
    const int r = me.r, c = me.c;
    std::vector<T> cur = std::move(me.kv), next(me.block);
    std::vector<S> o = detail::start_merge(lse, B, Tl, H, hd);
    for (int step = 0; step < c; ++step) {
      const int src = (r - step + c) % c;  // whose keys and values this rank holds now
      detail::block_forward(o.data(), lse, qkv, cur.data(), B, Tl, H, hd, g, [&](index i) { return ch.position(r, i); },
                            [&](index j) { return ch.position(src, j); });
      if (step + 1 < c) {
        detail::ring_shift(comm, std::span<const T>(cur), std::span<T>(next));
        std::swap(cur, next);
      }
    }
    detail::finish_merge(out, o);
  }

  // dqkv (B, Tl, H/g, g + 2, hd) of this rank's rows from dout and what forward returned.
  template <Communicator C, class T, class S = accumulate_t<T>>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g = 1) {
    detail::Local<T> me(ch, comm.rank(), comm.size(), qkv, B, Tl, H, hd, g, "context::Ring::backward");
    const int r = me.r, c = me.c;
    std::vector<T> cur = std::move(me.kv), next(me.block);
    std::vector<S> dcur(me.block, S(0)), dnext(me.block), dq(static_cast<std::size_t>(B * Tl * (H / g) * (g + 2) * hd), S(0)),
        D(static_cast<std::size_t>(B * H * Tl));
    detail::row_dots(D.data(), dout, out, B, Tl, H, hd);
    for (int step = 0; step < c; ++step) {
      const int src = (r - step + c) % c;
      detail::block_backward(dq.data(), dcur.data(), qkv, cur.data(), dout, D.data(), lse, B, Tl, H, hd, g,
                             [&](index i) { return ch.position(r, i); }, [&](index j) { return ch.position(src, j); });
      if (c == 1) break;
      // The block and its gradient travel on together; after the last step (where rank r holds rank
      // r + 1's block) the gradient goes once more, home to the rank whose keys and values they are.
      if (step + 1 < c) {
        detail::ring_shift(comm, std::span<const T>(cur), std::span<T>(next));
        std::swap(cur, next);
      }
      detail::ring_shift(comm, std::span<const S>(dcur), std::span<S>(dnext));
      std::swap(dcur, dnext);
    }
    detail::write_dqkv(dqkv, dq.data(), dcur.data(), B, Tl, H, hd, g);
  }
};

struct AllGather {
  static constexpr const char* name = "all-gather";

  template <Communicator C, class T, class S = accumulate_t<T>>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd,
                      index g = 1) {
    detail::Local<T> me(ch, comm.rank(), comm.size(), qkv, B, Tl, H, hd, g, "context::AllGather::forward");
    const int r = me.r, c = me.c;
    const std::size_t block = me.block;
    std::vector<T> all(block * static_cast<std::size_t>(c));
    comm.all_gather(std::span<const T>(me.kv), std::span<T>(all));  // rank k's block at k * block
    std::vector<S> o = detail::start_merge(lse, B, Tl, H, hd);
    for (int src = 0; src < c; ++src)
      detail::block_forward(o.data(), lse, qkv, all.data() + static_cast<std::size_t>(src) * block, B, Tl, H, hd, g,
                            [&](index i) { return ch.position(r, i); }, [&](index j) { return ch.position(src, j); });
    detail::finish_merge(out, o);
  }

  template <Communicator C, class T, class S = accumulate_t<T>>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g = 1) {
    detail::Local<T> me(ch, comm.rank(), comm.size(), qkv, B, Tl, H, hd, g, "context::AllGather::backward");
    const int r = me.r, c = me.c;
    const std::size_t block = me.block;
    std::vector<T> all(block * static_cast<std::size_t>(c));
    comm.all_gather(std::span<const T>(me.kv), std::span<T>(all));  // again: the forward kept none
    std::vector<S> dall(block * static_cast<std::size_t>(c), S(0)), dmine(block),
        dq(static_cast<std::size_t>(B * Tl * (H / g) * (g + 2) * hd), S(0)), D(static_cast<std::size_t>(B * H * Tl));
    detail::row_dots(D.data(), dout, out, B, Tl, H, hd);
    for (int src = 0; src < c; ++src)
      detail::block_backward(dq.data(), dall.data() + static_cast<std::size_t>(src) * block, qkv,
                             all.data() + static_cast<std::size_t>(src) * block, dout, D.data(), lse, B, Tl, H, hd, g,
                             [&](index i) { return ch.position(r, i); }, [&](index j) { return ch.position(src, j); });
    comm.reduce_scatter(std::span<const S>(dall), std::span<S>(dmine), ReduceOp::sum);
    detail::write_dqkv(dqkv, dq.data(), dmine.data(), B, Tl, H, hd, g);
  }
};

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
