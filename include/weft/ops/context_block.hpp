// ops::ContextBlock: the arithmetic of attention over the context axis (context/attention.hpp runs
// it around its ring or over its gathered blocks), one block of keys and values at a time, merged
// by log-sum-exp, causal or not and with or without padding (ops::Mask). An op (ops/op.hpp): the host's here, the Cuda
// device's in context_block.cuh.
//
//   qkv  (B, Tl, G, g + 2, hd)   a rank's Tl rows: G key-value groups of g queries, a key and a value
//                                (ops::Attention's layout), H = G g heads of size hd
//   kv   (B, Tl, G, 2, hd)       one block of keys and values (a rank's own: pack_kv), what travels
//   o    (B, Tl, H, hd)          the merged output so far, in S = accumulate_t<T>
//   lse  (B, H, Tl)              each query row's log-sum-exp of its scaled scores so far, in S
//   dq   (B, Tl, G, g + 2, hd)   the queries' gradients in the qkv layout (its k, v slots unused), in S
//   dkv  (B, Tl, G, 2, hd)       a block's key and value gradients, in S
//   qpos, kpos                   the positions of the query rows and of the block's key rows
//                                (ops::Positions: a context rank's two chunks); the mask is by
//                                position in the whole sequence (Mask::sees), so a block wholly
//                                after a query (causal) or wholly padding adds nothing to it
//   m                            the mask; its lengths (B) in the device's memory
//
//   pack_kv     kv = the keys and values of qkv
//   start       o = 0, lse = -inf (what forward merges into)
//   forward     merges one block into (o, lse)
//   finish      out (T) = o
//   row_dots    D (B, H, Tl) = rowsum(dout * out) per head
//   backward    one block's gradients: P = exp(scale q k - lse), dS = P (dout v - D) scale;
//               dq += dS k, dk += dS q, dv += P dout (accumulated: zero them first)
//   write_dqkv  dqkv (T) = dq's query slots and this rank's own dkv
//
// The host's sums run in S in a fixed order (the same bits on any thread count: one thread);
// tests/context/attention.cpp holds the whole attention to one rank's, tests/device/cuda/context.cu
// the Cuda device's ops to these in double.
//
// defines: ops::ContextBlock (Host; on Meta through its layer), its host kernels (ops::host_context: pack_kv,
// block_forward,
//   block_backward, row_dots, write_dqkv, start_merge, finish_merge)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/ops/mask.hpp"
#include "weft/ops/op.hpp"
#include "weft/ops/positions.hpp"

namespace weft::ops {

namespace host_context {

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
template <class T, class S>
void block_forward(S* o, S* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd, index g,
                   Positions qpos, Positions kpos, Mask m = {}) {
  const index G = H / g, row = G * (g + 2) * hd;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  std::vector<S> s(static_cast<std::size_t>(Tl)), ob(static_cast<std::size_t>(hd));
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h)
      for (index i = 0; i < Tl; ++i) {
        const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
        const index p = qpos.at(i);
        S mx = -std::numeric_limits<S>::infinity();
        for (index j = 0; j < Tl; ++j) {
          if (!m.sees(b, p, kpos.at(j))) continue;
          const T* k = kv + ((b * Tl + j) * G + h / g) * 2 * hd;
          S dot = 0;
          for (index d = 0; d < hd; ++d) dot += widen(q[d]) * widen(k[d]);
          s[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        if (mx == -std::numeric_limits<S>::infinity()) continue;  // the query sees no key of the block
        S sum = 0;
        for (index j = 0; j < Tl; ++j)
          if (m.sees(b, p, kpos.at(j))) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        const S lb = mx + std::log(sum);
        std::fill(ob.begin(), ob.end(), S(0));
        for (index j = 0; j < Tl; ++j) {
          if (!m.sees(b, p, kpos.at(j))) continue;
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
template <class T, class S>
void block_backward(S* dq, S* dkv, const T* qkv, const T* kv, const T* dout, const S* D, const S* lse, index B,
                    index Tl, index H, index hd, index g, Positions qpos, Positions kpos, Mask m = {}) {
  const index G = H / g, row = G * (g + 2) * hd;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h)
      for (index i = 0; i < Tl; ++i) {
        const index p = qpos.at(i);
        const T* q = qkv + (b * Tl + i) * row + q_at(h, hd, g);
        const T* dout_i = dout + ((b * Tl + i) * H + h) * hd;
        S* dq_i = dq + (b * Tl + i) * row + q_at(h, hd, g);
        const S l = lse[(b * H + h) * Tl + i], Di = D[(b * H + h) * Tl + i];
        for (index j = 0; j < Tl; ++j) {
          if (!m.sees(b, p, kpos.at(j))) continue;
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

// o = 0 and lse = -inf: what a forward merges blocks into.
template <class S>
void start_merge(S* o, S* lse, index B, index Tl, index H, index hd) {
  std::fill(lse, lse + B * H * Tl, -std::numeric_limits<S>::infinity());
  std::fill(o, o + B * Tl * H * hd, S(0));
}
template <class T, class S>
void finish_merge(T* out, const S* o, index n) {
  for (index i = 0; i < n; ++i) out[i] = narrow<T>(o[i]);
}

}  // namespace host_context

template <class D>
struct ContextBlock;

template <>
struct ContextBlock<Host> {
  template <class T>
  static void pack_kv(Host&, T* kv, const T* qkv, index B, index Tl, index H, index hd, index g) {
    host_context::pack_kv(kv, qkv, B, Tl, H, hd, g);
  }
  template <class S>
  static void start(Host&, S* o, S* lse, index B, index Tl, index H, index hd) {
    host_context::start_merge(o, lse, B, Tl, H, hd);
  }
  template <class T, class S>
  static void forward(Host&, S* o, S* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd, index g,
                      Positions qpos, Positions kpos, Mask m = {}) {
    host_context::block_forward(o, lse, qkv, kv, B, Tl, H, hd, g, qpos, kpos, m);
  }
  template <class T, class S>
  static void finish(Host&, T* out, const S* o, index n) {
    host_context::finish_merge(out, o, n);
  }
  template <class T, class S>
  static void row_dots(Host&, S* D, const T* dout, const T* out, index B, index Tl, index H, index hd) {
    host_context::row_dots(D, dout, out, B, Tl, H, hd);
  }
  template <class T, class S>
  static void backward(Host&, S* dq, S* dkv, const T* qkv, const T* kv, const T* dout, const S* D, const S* lse,
                       index B, index Tl, index H, index hd, index g, Positions qpos, Positions kpos, Mask m = {}) {
    host_context::block_backward(dq, dkv, qkv, kv, dout, D, lse, B, Tl, H, hd, g, qpos, kpos, m);
  }
  template <class T, class S>
  static void write_dqkv(Host&, T* dqkv, const S* dq, const S* dkv, index B, index Tl, index H, index hd, index g) {
    host_context::write_dqkv(dqkv, dq, dkv, B, Tl, H, hd, g);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_CONTEXT_BLOCK_INSTANCES(EXTERN, T)                                                               \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::pack_kv<T>(                                            \
      weft::Host&, T*, const T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t);            \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::forward<T, weft::accumulate_t<T>>(                     \
      weft::Host&, weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, std::int64_t, std::int64_t, \
      std::int64_t, std::int64_t, std::int64_t, weft::ops::Positions, weft::ops::Positions, weft::ops::Mask);      \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::finish<T, weft::accumulate_t<T>>(                      \
      weft::Host&, T*, const weft::accumulate_t<T>*, std::int64_t);                                                \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::row_dots<T, weft::accumulate_t<T>>(                    \
      weft::Host&, weft::accumulate_t<T>*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,           \
      std::int64_t);                                                                                               \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::backward<T, weft::accumulate_t<T>>(                    \
      weft::Host&, weft::accumulate_t<T>*, weft::accumulate_t<T>*, const T*, const T*, const T*,                   \
      const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, std::int64_t, std::int64_t, std::int64_t,        \
      std::int64_t, std::int64_t, weft::ops::Positions, weft::ops::Positions, weft::ops::Mask);                    \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::write_dqkv<T, weft::accumulate_t<T>>(                  \
      weft::Host&, T*, const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, std::int64_t, std::int64_t,     \
      std::int64_t, std::int64_t, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_CONTEXT_BLOCK_INSTANCES)
#define WEFT_HOST_CONTEXT_BLOCK_PAIRS(EXTERN)                                                                          \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::start<float>(weft::Host&, float*, float*, std::int64_t,    \
                                                                         std::int64_t, std::int64_t, std::int64_t);    \
  EXTERN template void weft::ops::ContextBlock<weft::Host>::start<double>(weft::Host&, double*, double*, std::int64_t, \
                                                                          std::int64_t, std::int64_t, std::int64_t);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_CONTEXT_BLOCK_PAIRS)
