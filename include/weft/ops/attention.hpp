// ops::Attention: attention over H local heads of size hd in groups of g heads that share a key and a
// value (grouped-query attention; g = 1 is GPT-2's multi-head attention), causal or bidirectional,
// with or without padding (ops::Mask, ops/mask.hpp; causal unless told). Each token's qkv row is
// (H/g, g + 2, hd): a group's g queries, then its key and its value (for g = 1, (H, {q, k, v}, hd));
// out (B, T, H, hd); probs (B, H, T, T) kept for backward, exact zeros where the mask hides a key.
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in attention.cuh.
// Layers call ops::Attention<D>::forward(dev, ...).
//
// defines: ops::Attention (Host, Meta), host::attention_forward, host::attention_backward
#pragma once

#include <cstdint>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/mask.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

namespace detail {

// The core in float on GEMMs (host::gemm), one (batch, head) at a time, in blocks of kRows query
// rows. Each row sees a prefix of the keys (ops::Mask::keys): block [i0, i1) needs keys [0, kend)
// only, kend = min(i1, length) when causal (the GEMMs skip most of the masked future: counted, 5/8
// of the full products at T = 128 with 32-row blocks), the sample's length when not. The same maths
// as the loops of attention_forward and attention_backward, with the hidden keys masked after the
// scores (exact zeros in probs and dS, which the products then skip at no error):
//   forward:  P = softmax(scale q k^T, masked)  (T, T);  out = P v
//   backward: dP = dout v^T;  dS = P (dP - rowsum(P dP)) scale;  dq = dS k;  dk = dS^T q;  dv = P^T dout
// Row sums in lanes (lane_sum), GEMMs single-threaded: bitwise repeatable.
inline constexpr index kRows = 32;

// Where head h's q and its group's k (v follows k) start in a token's qkv row of (H/g, g + 2, hd).
constexpr index attention_q(index h, index hd, index g) { return ((h / g) * (g + 2) + h % g) * hd; }
constexpr index attention_k(index h, index hd, index g) { return ((h / g) * (g + 2) + g) * hd; }

inline void attention_forward_gemm(float* out, float* probs, const float* qkv, index B, index Tn, index H, index hd,
                                   index g, ops::Mask m) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const index row = (H / g) * (g + 2) * hd, orow = H * hd;  // one token's qkv; one token's output
  std::vector<float, Eigen::aligned_allocator<float>> buf;
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      const float* q = qkv + b * Tn * row + attention_q(h, hd, g);
      const float* k = qkv + b * Tn * row + attention_k(h, hd, g);
      float* P = probs + (b * H + h) * Tn * Tn;
      for (index i0 = 0; i0 < Tn; i0 += kRows) {
        const index i1 = std::min(Tn, i0 + kRows), rows = i1 - i0, kend = m.keys(b, i1 - 1, Tn);
        gemm<float>(Trans::no, Trans::yes, rows, kend, hd, scale, q + i0 * row, row, k, row, 0.0f, P + i0 * Tn, Tn);
        for (index i = i0; i < i1; ++i) {  // softmax of row i over keys [0, n): max, exp, sum, scale
          float* p = P + i * Tn;
          const index n = m.keys(b, i, Tn);
          const float mx = lane_max(n, p);
          exp_rows(buf, p, n, mx);
          const float* e = buf.data();
          const float inv = 1.0f / lane_sum<float>(n, [&](index j) { return e[j]; });
          for (index j = 0; j < n; ++j) p[j] = e[j] * inv;
          std::fill(p + n, p + Tn, 0.0f);
        }
        gemm<float>(Trans::no, Trans::no, rows, hd, kend, 1.0f, P + i0 * Tn, Tn, k + hd, row, 0.0f,
                    out + (b * Tn + i0) * orow + h * hd, orow);
      }
    }
}

inline void attention_backward_gemm(float* dqkv, const float* dout, const float* qkv, const float* probs, index B,
                                    index Tn, index H, index hd, index g, ops::Mask m) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const index row = (H / g) * (g + 2) * hd, orow = H * hd;
  std::vector<float> dS(static_cast<std::size_t>(Tn * Tn));
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      const float* q = qkv + b * Tn * row + attention_q(h, hd, g);
      const float* k = qkv + b * Tn * row + attention_k(h, hd, g);
      const float* dO = dout + b * Tn * orow + h * hd;
      const float* P = probs + (b * H + h) * Tn * Tn;
      float* dq = dqkv + b * Tn * row + attention_q(h, hd, g);
      float* dk = dqkv + b * Tn * row + attention_k(h, hd, g);
      const float beta = h % g == 0 ? 0.0f : 1.0f;  // a group's later heads add to its k and v gradients
      // Row blocks: dS rows [i0, i1) over keys [0, kend) (zero where hidden), then dq for them.
      for (index i0 = 0; i0 < Tn; i0 += kRows) {
        const index i1 = std::min(Tn, i0 + kRows), rows = i1 - i0, kend = m.keys(b, i1 - 1, Tn);
        float* d0 = dS.data() + i0 * Tn;
        gemm<float>(Trans::no, Trans::yes, rows, kend, hd, 1.0f, dO + i0 * orow, orow, k + hd, row, 0.0f, d0,
                    Tn);  // dP
        for (index i = i0; i < i1; ++i) {
          const float* p = P + i * Tn;
          float* d = dS.data() + i * Tn;
          const index n = m.keys(b, i, Tn);
          const float dot = lane_sum<float>(n, [&](index j) { return p[j] * d[j]; });
          for (index j = 0; j < n; ++j) d[j] = p[j] * (d[j] - dot) * scale;
          std::fill(d + n, d + Tn, 0.0f);  // what the column blocks below read of row i
        }
        gemm<float>(Trans::no, Trans::no, rows, hd, kend, 1.0f, d0, Tn, k, row, 0.0f, dq + i0 * row, row);  // dq = dS k
      }
      // Column blocks: keys [j0, j1) gather from queries [q0, T): q0 = j0 when causal (the earlier
      // queries do not see them), 0 when not. Keys no query sees get exact zeros.
      for (index j0 = 0; j0 < Tn; j0 += kRows) {
        const index j1 = std::min(Tn, j0 + kRows), cols = j1 - j0, q0 = m.causal ? j0 : 0, n = Tn - q0;
        gemm<float>(Trans::yes, Trans::no, cols, hd, n, 1.0f, dS.data() + q0 * Tn + j0, Tn, q + q0 * row, row, beta,
                    dk + j0 * row, row);  // dk = dS^T q
        gemm<float>(Trans::yes, Trans::no, cols, hd, n, 1.0f, P + q0 * Tn + j0, Tn, dO + q0 * orow, orow, beta,
                    dk + j0 * row + hd, row);  // dv = P^T dout
      }
    }
}

// x (n values of T) in S: x itself where T is S, else its values widened once into `copy` (the
// loops below read each of them T times; widened once, the bits are the same).
template <class S, class T>
const S* accumulated(const T* x, index n, std::vector<S>& copy) {
  if constexpr (std::same_as<T, S>) {
    return x;
  } else {
    copy.resize(static_cast<std::size_t>(n));
    for (index i = 0; i < n; ++i) copy[static_cast<std::size_t>(i)] = widen(x[i]);
    return copy.data();
  }
}

}  // namespace detail

// Self-attention core for H heads of size hd in groups of g that share their keys and values
// (grouped-query attention: H / g key-value heads; g = 1 is multi-head attention, GPT-2's), each
// query row i of sample b over keys [0, m.keys(b, i, T)) (ops::Mask: causal unless told, padding
// where lengths are given; host memory here).
//   qkv   (B, T, H/g, g + 2, hd)  a group's g queries, its key and its value side by side (whole
//                                 groups stay together when the fused QKV projection is sharded);
//                                 for g = 1, (B, T, H, 3, hd)
//   out   (B, T, H, hd)           head h reads the keys and values of group h / g
//   probs (B, H, T, T)            softmax(q k^T / sqrt(hd)) with hidden keys masked to 0, saved for backward;
//                                 computed in S, stored in T, and the output reads the stored values
// The loops below are the reference (double, and bf16 storage); float runs the same maths on GEMMs
// (detail::attention_forward_gemm).
template <class T>
void attention_forward(T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1,
                       ops::Mask m = {}) {
  if constexpr (std::same_as<T, float>) return detail::attention_forward_gemm(out, probs, qkv, B, Tn, H, hd, g, m);
  using S = accumulate_t<T>;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  const index row = (H / g) * (g + 2) * hd;  // one token's qkv
  std::vector<S> p(static_cast<std::size_t>(Tn)), o(static_cast<std::size_t>(hd)), wide;
  const S* x = detail::accumulated(qkv, B * Tn * row, wide);  // qkv in S
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      T* P = probs + (b * H + h) * Tn * Tn;
      const index qo = detail::attention_q(h, hd, g), ko = detail::attention_k(h, hd, g);
      for (index i = 0; i < Tn; ++i) {
        const S* q = x + (b * Tn + i) * row + qo;
        const index n = m.keys(b, i, Tn);  // keys [0, n) seen
        S mx = -std::numeric_limits<S>::infinity();
        for (index j = 0; j < n; ++j) {
          const S* k = x + (b * Tn + j) * row + ko;
          S s = 0;
          for (index d = 0; d < hd; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        S sum = 0;
        for (index j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (index j = 0; j < n; ++j) P[i * Tn + j] = narrow<T>(p[j] / sum);
        for (index j = n; j < Tn; ++j) P[i * Tn + j] = narrow<T>(S(0));
        std::fill(o.begin(), o.end(), S(0));
        for (index j = 0; j < n; ++j) {
          const S* v = x + (b * Tn + j) * row + ko + hd;
          const S pij = widen(P[i * Tn + j]);
          for (index d = 0; d < hd; ++d) o[d] += pij * v[d];
        }
        T* out_i = out + ((b * Tn + i) * H + h) * hd;
        for (index d = 0; d < hd; ++d) out_i[d] = narrow<T>(o[d]);
      }
    }
}

// dqkv (B, T, H/g, g + 2, hd) = gradient of the attention core, from dout (B, T, H, hd) and saved
// probs; accumulated in S (a group's keys and values over its g heads) and written once.
template <class T>
void attention_backward(T* dqkv_out, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H, index hd,
                        index g = 1, ops::Mask m = {}) {
  if constexpr (std::same_as<T, float>)
    return detail::attention_backward_gemm(dqkv_out, dout, qkv, probs, B, Tn, H, hd, g, m);
  using S = accumulate_t<T>;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  const index row = (H / g) * (g + 2) * hd;
  std::vector<S> scratch;
  S* dqkv;
  if constexpr (std::same_as<T, S>) {
    dqkv = dqkv_out;
  } else {
    scratch.resize(static_cast<std::size_t>(B * Tn * row));
    dqkv = scratch.data();
  }
  std::fill(dqkv, dqkv + B * Tn * row, S(0));
  std::vector<S> wide, wide_dout;
  const S* x = detail::accumulated(qkv, B * Tn * row, wide);            // qkv in S
  const S* dy = detail::accumulated(dout, B * Tn * H * hd, wide_dout);  // dout in S
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      const T* P = probs + (b * H + h) * Tn * Tn;
      const index qo = detail::attention_q(h, hd, g), ko = detail::attention_k(h, hd, g);
      for (index i = 0; i < Tn; ++i) {
        const S* dout_i = dy + ((b * Tn + i) * H + h) * hd;
        const S* q = x + (b * Tn + i) * row + qo;
        S* dq = dqkv + (b * Tn + i) * row + qo;
        const index n = m.keys(b, i, Tn);
        // dP_ij = dout_i . v_j; dv_j += P_ij dout_i; dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij).
        S dot = 0;
        for (index j = 0; j < n; ++j) {
          const S* v = x + (b * Tn + j) * row + ko + hd;
          S dp = 0;
          for (index d = 0; d < hd; ++d) dp += dout_i[d] * v[d];
          dot += widen(P[i * Tn + j]) * dp;
        }
        for (index j = 0; j < n; ++j) {
          const S* k = x + (b * Tn + j) * row + ko;
          const S* v = k + hd;
          S* dk = dqkv + (b * Tn + j) * row + ko;
          S* dv = dk + hd;
          S dp = 0;
          for (index d = 0; d < hd; ++d) dp += dout_i[d] * v[d];
          const S pij = widen(P[i * Tn + j]);
          const S ds = pij * (dp - dot) * scale;
          for (index d = 0; d < hd; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
            dv[d] += pij * dout_i[d];
          }
        }
      }
    }
  if constexpr (!std::same_as<T, S>)
    for (index i = 0; i < B * Tn * row; ++i) dqkv_out[i] = narrow<T>(dqkv[i]);
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct Attention;

template <>
struct Attention<Host> {
  // Attention over H local heads of size hd in groups of g, masked by m (lengths in host memory);
  // probs (B, H, T, T).
  template <class T>
  static void forward(Host&, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1,
                      Mask m = {}) {
    const host::Timed timed(host::Op::attention);
    check_lengths(m, B, Tn, "ops::Attention<Host>::forward");
    const index row = (H / g) * (g + 2) * hd, orow = H * hd;  // one token's qkv, one token's output
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_forward(out + lo * Tn * orow, probs + lo * H * Tn * Tn, qkv + lo * Tn * row, hi - lo, Tn, H, hd,
                              g, from(m, lo));
    });
  }

  template <class T>
  static void backward(Host&, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                       index hd, index g = 1, Mask m = {}) {
    const host::Timed timed(host::Op::attention);
    check_lengths(m, B, Tn, "ops::Attention<Host>::backward");
    const index row = (H / g) * (g + 2) * hd, orow = H * hd;
    host::split(B, 1, [&](index lo, index hi) {
      host::attention_backward(dqkv + lo * Tn * row, dout + lo * Tn * orow, qkv + lo * Tn * row,
                               probs + lo * H * Tn * Tn, hi - lo, Tn, H, hd, g, from(m, lo));
    });
  }

 private:
  static Mask from(Mask m, index first) {  // the mask of samples first, first + 1, ...
    if (m.lengths) m.lengths += first;
    return m;
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
// QK^T and PV over the pairs seen: the lower triangle when causal, 2 B H T (T + 1) hd FLOPs
// forward; every pair when not, 4 B H T^2 hd; twice that backward. Padding is not known here
// (lengths are data): the count is that of full samples, what the kernels' work is bounded by.
template <class D>
struct Attention<Meta<D>> {
  template <class T>
  static void forward(Meta<D>& d, T*, T*, const T*, index B, index Tn, index H, index hd, index = 1, Mask m = {}) {
    d.work.attention_flops += core(B, Tn, H, hd, m.causal);
  }
  template <class T>
  static void backward(Meta<D>& d, T*, const T*, const T*, const T*, index B, index Tn, index H, index hd, index = 1,
                       Mask m = {}) {
    d.work.attention_flops += 2 * core(B, Tn, H, hd, m.causal);
  }
  static double core(index B, index Tn, index H, index hd, bool causal = true) {
    return (causal ? 2.0 : 4.0) * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(Tn) *
           static_cast<double>(causal ? Tn + 1 : Tn) * static_cast<double>(hd);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_ATTENTION_INSTANCES(EXTERN, T)                                                                       \
  EXTERN template void weft::ops::Attention<weft::Host>::forward<T>(weft::Host&, T*, T*, const T*, std::int64_t,       \
                                                                    std::int64_t, std::int64_t, std::int64_t,          \
                                                                    std::int64_t, weft::ops::Mask);                    \
  EXTERN template void weft::ops::Attention<weft::Host>::backward<T>(weft::Host&, T*, const T*, const T*, const T*,    \
                                                                     std::int64_t, std::int64_t, std::int64_t,         \
                                                                     std::int64_t, std::int64_t, weft::ops::Mask);     \
  EXTERN template void weft::host::attention_forward<T>(T*, T*, const T*, std::int64_t, std::int64_t, std::int64_t,    \
                                                        std::int64_t, std::int64_t, weft::ops::Mask);                  \
  EXTERN template void weft::host::attention_backward<T>(T*, const T*, const T*, const T*, std::int64_t, std::int64_t, \
                                                         std::int64_t, std::int64_t, std::int64_t, weft::ops::Mask);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_ATTENTION_INSTANCES)
