// Host reference ops: the op set every back end implements, over row-major buffers.
//
// These are the reference the CUDA ops are tested against, and the compute of the host back end,
// for T = double (finite-difference checks exact to 1e-6 and better), float, and bf16 storage. Each
// op reads T, computes in S = accumulate_t<T> (float for bf16; T otherwise) and writes a T output
// once (one rounding, where the GPU rounds); parameter gradients, statistics and the optimizer's
// buffers are in S (core/precision.hpp). For float and double, widen and narrow are the identity.
// Conventions, as in llm.c: activation gradients are written (=), parameter gradients accumulate
// (+=) so micro-batches add up; sizes are element counts.
//
// double runs plain serial loops: the oracle. Float (and bf16, computed in float) takes faster
// paths with the same maths, checked against double in tests/device/host/ops.cpp: Eigen's
// vectorized exp (GELU, softmax, cross-entropy), row sums in 16 lanes (detail::lane_sum), the
// attention core on GEMMs. Every reduction's order is fixed by the sizes alone, so results are
// bitwise repeatable run to run and rank to rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "weft/core/dtype.hpp"
#include "weft/core/philox.hpp"
#include "weft/core/shape.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/init.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/positions.hpp"

namespace weft::host {

using index = std::int64_t;

namespace detail {

// sum over i < n of f(i) in kLanes partial sums (lane j takes i = j, j + kLanes, ...), added at the
// end in a fixed tree: the compiler vectorizes it without reordering anything, and the order
// depends on n only, so the bits are the same in every run and on every rank. A is the sum's type.
inline constexpr index kLanes = 16;
template <class A, class F>
A lane_sum(index n, F f) {
  A lane[kLanes] = {};
  index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (index j = 0; j < kLanes; ++j) lane[j] += f(i + j);
  for (index j = 0; i + j < n; ++j) lane[j] += f(i + j);
  for (index w = kLanes / 2; w > 0; w /= 2)
    for (index j = 0; j < w; ++j) lane[j] += lane[j + w];
  return lane[0];
}

// max over x[0, n) (n >= 1) in kLanes lanes: exact in any order, and vectorized.
inline float lane_max(index n, const float* x) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (index j = 0; j < kLanes; ++j) lane[j] = lane[j] > x[i + j] ? lane[j] : x[i + j];
  for (index j = 0; i + j < n; ++j) lane[j] = lane[j] > x[i + j] ? lane[j] : x[i + j];
  float m = lane[0];
  for (index j = 1; j < kLanes; ++j) m = m > lane[j] ? m : lane[j];
  return m;
}

// Elementwise float math on Eigen's packets (its vectorized tanh and exp), in chunks of kChunk
// elements copied (widened) into aligned buffers, the last chunk padded: every element takes the
// packet path whatever its address or position, so the same input gives the same bits on every
// rank and in every run.
inline constexpr index kChunk = 256;
using Chunk = Eigen::Array<float, kChunk, 1>;
using ChunkMap = Eigen::Map<Chunk, Eigen::Aligned64>;

// out[i] = f(a[i], b[i]) (b may be null) for i < n; f takes and returns chunks.
template <class T, class F>
void chunked(T* out, const T* a, const T* b, index n, F f) {
  alignas(64) float ab[kChunk], bb[kChunk], ob[kChunk];
  for (index at = 0; at < n; at += kChunk) {
    const index len = std::min(kChunk, n - at);
    for (index i = 0; i < len; ++i) ab[i] = static_cast<float>(widen(a[at + i]));
    std::fill(ab + len, ab + kChunk, 0.0f);
    if (b) {
      for (index i = 0; i < len; ++i) bb[i] = static_cast<float>(widen(b[at + i]));
      std::fill(bb + len, bb + kChunk, 0.0f);
    }
    ChunkMap o(ob);
    o = f(ChunkMap(ab), ChunkMap(bb));
    for (index i = 0; i < len; ++i) out[at + i] = narrow<T>(ob[i]);
  }
}

}  // namespace detail

// Row sums: serial in double (the oracle), detail::lane_sum in float.
template <class S, class F>
S row_sum(index n, F f) {
  if constexpr (std::same_as<S, double>) {
    S s = 0;
    for (index i = 0; i < n; ++i) s += f(i);
    return s;
  } else {
    return detail::lane_sum<S>(n, f);
  }
}

// LayerNorm over the last dim of x (N, C): out = (x - mean) rstd w + b; saves mean, rstd (N) in S.
template <class T, class S = accumulate_t<T>>
void layernorm_forward(T* out, S* mean, S* rstd, const T* x, const T* w, const T* b, index N, index C, S eps) {
  for (index n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    S m = row_sum<S>(C, [&](index c) { return widen(xr[c]); });
    m /= static_cast<S>(C);
    S v = row_sum<S>(C, [&](index c) { return (widen(xr[c]) - m) * (widen(xr[c]) - m); });
    v /= static_cast<S>(C);
    const S s = S(1) / std::sqrt(v + eps);
    for (index c = 0; c < C; ++c) out[n * C + c] = narrow<T>((widen(xr[c]) - m) * s * widen(w[c]) + widen(b[c]));
    mean[n] = m;
    rstd[n] = s;
  }
}

// dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)) with dnorm = dout w;  dw += sum dout norm;
// db += sum dout (sums over the N rows). With a residual gradient (not null), dx += dresid: the
// gradient of x + f(layernorm(x)) in one pass. In two parts, so that each can be split for threads
// without changing a bit: layernorm_backward_dx over rows [n0, n1), layernorm_backward_params over
// columns [c0, c1) (each column summed over every row, in order).
template <class T, class S = accumulate_t<T>>
void layernorm_backward_dx(T* dx, const T* dout, const T* x, const T* w, const S* mean, const S* rstd, index n0,
                           index n1, index C, const T* dresid = nullptr) {
  for (index n = n0; n < n1; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    S mean_d = row_sum<S>(C, [&](index c) { return widen(dr[c]) * widen(w[c]); });
    S mean_dn = row_sum<S>(C, [&](index c) { return widen(dr[c]) * widen(w[c]) * ((widen(xr[c]) - mean[n]) * rstd[n]); });
    mean_d /= static_cast<S>(C);
    mean_dn /= static_cast<S>(C);
    for (index c = 0; c < C; ++c) {
      const S norm = (widen(xr[c]) - mean[n]) * rstd[n];
      const S dnorm = widen(dr[c]) * widen(w[c]);
      const S g = (dnorm - mean_d - norm * mean_dn) * rstd[n];
      dx[n * C + c] = narrow<T>(dresid ? g + widen(dresid[n * C + c]) : g);
    }
  }
}

template <class T, class S = accumulate_t<T>>
void layernorm_backward_params(S* dw, S* db, const T* dout, const T* x, const S* mean, const S* rstd, index N,
                               index C, index c0, index c1) {
  for (index n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    for (index c = c0; c < c1; ++c) {
      const S norm = (widen(xr[c]) - mean[n]) * rstd[n];
      dw[c] += widen(dr[c]) * norm;
      db[c] += widen(dr[c]);
    }
  }
}

template <class T, class S = accumulate_t<T>>
void layernorm_backward(T* dx, S* dw, S* db, const T* dout, const T* x, const T* w, const S* mean, const S* rstd,
                        index N, index C, const T* dresid = nullptr) {
  layernorm_backward_dx(dx, dout, x, w, mean, rstd, index{0}, N, C, dresid);
  layernorm_backward_params(dw, db, dout, x, mean, rstd, N, C, index{0}, C);
}

// out = gelu(x) (math::gelu, the tanh form). double: std::tanh per element (the oracle). float and
// bf16: in float on Eigen's vectorized exp, through 1 + tanh(u) = 2 s with s = 1 / (1 + E),
// E = exp(-2u), so gelu(x) = x s; and 1 - tanh(u)^2 = 4 s^2 E in the gradient: both accurate in
// the tails, where 1 - tanh(u) in float is 0. x is clamped to [-10, 10] inside (gelu is x or 0 there
// to float precision, slope 1 or 0), so E stays finite: gelu = xc s + max(x - 10, 0).
namespace detail {
inline constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;
template <class A>
Chunk gelu_exp(const A& Xc) {  // E = exp(-2u) at the clamped x
  return ((-2.0f * kGeluK) * (Xc + kGeluC * Xc * Xc * Xc)).min(80.0f).exp();
}
}  // namespace detail

template <class T>
void gelu_forward(T* out, const T* x, index n) {
  if constexpr (std::same_as<T, double>) {
    for (index i = 0; i < n; ++i) out[i] = math::gelu(x[i]);
  } else {
    detail::chunked(out, x, static_cast<const T*>(nullptr), n, [&](const auto& X, const auto&) {
      const detail::Chunk Xc = X.max(-10.0f).min(10.0f);
      return detail::Chunk(Xc / (1.0f + detail::gelu_exp(Xc)) + (X - 10.0f).max(0.0f));
    });
  }
}

// dx = dout gelu'(x) (math::gelu_grad) = dout (s + 2 x s^2 E du), du = k (1 + 3 c x^2); computed
// as gelu_forward is.
template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, index n) {
  if constexpr (std::same_as<T, double>) {
    for (index i = 0; i < n; ++i) dx[i] = dout[i] * math::gelu_grad(x[i]);
  } else {
    using detail::kGeluK, detail::kGeluC;
    detail::chunked(dx, x, dout, n, [&](const auto& X, const auto& D) {
      const detail::Chunk Xc = X.max(-10.0f).min(10.0f), E = detail::gelu_exp(Xc), s = 1.0f / (1.0f + E);
      return detail::Chunk(D * (s + 2.0f * Xc * s * s * E * (kGeluK * (1.0f + 3.0f * kGeluC * Xc * Xc))));
    });
  }
}

// out += x (the residual add; n elements).
template <class T>
void add_inplace(T* out, const T* x, index n) {
  for (index i = 0; i < n; ++i) out[i] = narrow<T>(widen(out[i]) + widen(x[i]));
}

// out (n) = v.
template <class T>
void fill(T* out, index n, T v) {
  for (index i = 0; i < n; ++i) out[i] = v;
}

// out (n) = in rounded to T (the master weights to the compute copy), or widened.
template <class To, class From>
void convert(To* out, const From* in, index n) {
  for (index i = 0; i < n; ++i) out[i] = static_cast<To>(static_cast<float>(in[i]));
}
template <class T>
void convert(T* out, const T* in, index n) {
  std::copy(in, in + n, out);
}

// y (N, C) += b (C) on every row (a Linear's bias).
template <class T>
void bias_add(T* y, const T* b, index N, index C) {
  for (index n = 0; n < N; ++n)
    for (index c = 0; c < C; ++c) y[n * C + c] = narrow<T>(widen(y[n * C + c]) + widen(b[c]));
}

// db (C) += the sum over rows of dy (N, C), rows in order.
template <class T, class S = accumulate_t<T>>
void bias_backward(S* db, const T* dy, index N, index C) {
  for (index n = 0; n < N; ++n)
    for (index c = 0; c < C; ++c) db[c] += widen(dy[n * C + c]);
}

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

namespace detail {

// buf[0, n) = exp(x[i] - shift) in float for x in T (float or bf16), on Eigen's packets.
template <class T>
void exp_rows(std::vector<float, Eigen::aligned_allocator<float>>& buf, const T* x, index n, float shift) {
  const index padded = (n + 15) / 16 * 16;
  if (static_cast<index>(buf.size()) < padded) buf.resize(static_cast<std::size_t>(padded));
  for (index i = 0; i < n; ++i) buf[static_cast<std::size_t>(i)] = static_cast<float>(widen(x[i]));
  std::fill(buf.data() + n, buf.data() + padded, shift);
  Eigen::Map<Eigen::ArrayXf, Eigen::Aligned16> b(buf.data(), padded);
  b = (b - shift).exp();
}

// The causal core in float on GEMMs (host::gemm), one (batch, head) at a time, in blocks of kRows
// query rows: block [i0, i1) needs keys [0, i1) only, so the GEMMs skip most of the masked future
// (counted: 5/8 of the full products at T = 128 with 32-row blocks). The same maths as the loops of
// attention_forward and attention_backward, with the future masked after the scores (exact zeros
// in probs and dS, which the products then skip at no error):
//   forward:  P = softmax(scale q k^T, masked)  (T, T);  out = P v
//   backward: dP = dout v^T;  dS = P (dP - rowsum(P dP)) scale;  dq = dS k;  dk = dS^T q;  dv = P^T dout
// Row sums in lanes (lane_sum), GEMMs single-threaded: bitwise repeatable.
inline constexpr index kRows = 32;

// Where head h's q and its group's k (v follows k) start in a token's qkv row of (H/g, g + 2, hd).
constexpr index attention_q(index h, index hd, index g) { return ((h / g) * (g + 2) + h % g) * hd; }
constexpr index attention_k(index h, index hd, index g) { return ((h / g) * (g + 2) + g) * hd; }

inline void attention_forward_gemm(float* out, float* probs, const float* qkv, index B, index Tn, index H, index hd,
                                   index g) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const index row = (H / g) * (g + 2) * hd, orow = H * hd;  // one token's qkv; one token's output
  std::vector<float, Eigen::aligned_allocator<float>> buf;
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      const float* q = qkv + b * Tn * row + attention_q(h, hd, g);
      const float* k = qkv + b * Tn * row + attention_k(h, hd, g);
      float* P = probs + (b * H + h) * Tn * Tn;
      for (index i0 = 0; i0 < Tn; i0 += kRows) {
        const index i1 = std::min(Tn, i0 + kRows), rows = i1 - i0;
        gemm<float>(Trans::no, Trans::yes, rows, i1, hd, scale, q + i0 * row, row, k, row, 0.0f, P + i0 * Tn, Tn);
        for (index i = i0; i < i1; ++i) {  // softmax of row i over keys [0, i]: max, exp, sum, scale
          float* p = P + i * Tn;
          const float mx = lane_max(i + 1, p);
          exp_rows(buf, p, i + 1, mx);
          const float* e = buf.data();
          const float inv = 1.0f / lane_sum<float>(i + 1, [&](index j) { return e[j]; });
          for (index j = 0; j <= i; ++j) p[j] = e[j] * inv;
          std::fill(p + i + 1, p + Tn, 0.0f);
        }
        gemm<float>(Trans::no, Trans::no, rows, hd, i1, 1.0f, P + i0 * Tn, Tn, k + hd, row, 0.0f,
                    out + (b * Tn + i0) * orow + h * hd, orow);
      }
    }
}

inline void attention_backward_gemm(float* dqkv, const float* dout, const float* qkv, const float* probs, index B,
                                    index Tn, index H, index hd, index g) {
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
      // Row blocks: dS rows [i0, i1) over keys [0, i1) (zero past the diagonal), then dq for them.
      for (index i0 = 0; i0 < Tn; i0 += kRows) {
        const index i1 = std::min(Tn, i0 + kRows), rows = i1 - i0;
        float* d0 = dS.data() + i0 * Tn;
        gemm<float>(Trans::no, Trans::yes, rows, i1, hd, 1.0f, dO + i0 * orow, orow, k + hd, row, 0.0f, d0, Tn);  // dP
        for (index i = i0; i < i1; ++i) {
          const float* p = P + i * Tn;
          float* d = dS.data() + i * Tn;
          const float dot = lane_sum<float>(i + 1, [&](index j) { return p[j] * d[j]; });
          for (index j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - dot) * scale;
          std::fill(d + i + 1, d + i1, 0.0f);
        }
        gemm<float>(Trans::no, Trans::no, rows, hd, i1, 1.0f, d0, Tn, k, row, 0.0f, dq + i0 * row, row);  // dq = dS k
      }
      // Column blocks: keys [j0, j1) gather from queries [j0, T) (the earlier ones do not see them).
      for (index j0 = 0; j0 < Tn; j0 += kRows) {
        const index j1 = std::min(Tn, j0 + kRows), cols = j1 - j0, n = Tn - j0;
        gemm<float>(Trans::yes, Trans::no, cols, hd, n, 1.0f, dS.data() + j0 * Tn + j0, Tn, q + j0 * row, row, beta,
                    dk + j0 * row, row);  // dk = dS^T q
        gemm<float>(Trans::yes, Trans::no, cols, hd, n, 1.0f, P + j0 * Tn + j0, Tn, dO + j0 * orow, orow, beta,
                    dk + j0 * row + hd, row);  // dv = P^T dout
      }
    }
}

}  // namespace detail

// Causal self-attention core for H heads of size hd in groups of g that share their keys and values
// (grouped-query attention: H / g key-value heads; g = 1 is multi-head attention, GPT-2's).
//   qkv   (B, T, H/g, g + 2, hd)  a group's g queries, its key and its value side by side (whole
//                                 groups stay together when the fused QKV projection is sharded);
//                                 for g = 1, (B, T, H, 3, hd)
//   out   (B, T, H, hd)           head h reads the keys and values of group h / g
//   probs (B, H, T, T)            softmax(q k^T / sqrt(hd)) with the future masked, saved for backward;
//                                 computed in S, stored in T, and the output reads the stored values
// The loops below are the reference (double, and bf16 storage); float runs the same maths on GEMMs
// (detail::attention_forward_gemm).
template <class T>
void attention_forward(T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd, index g = 1) {
  if constexpr (std::same_as<T, float>) return detail::attention_forward_gemm(out, probs, qkv, B, Tn, H, hd, g);
  using S = accumulate_t<T>;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  const index row = (H / g) * (g + 2) * hd;  // one token's qkv
  std::vector<S> p(static_cast<std::size_t>(Tn)), o(static_cast<std::size_t>(hd));
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      T* P = probs + (b * H + h) * Tn * Tn;
      const index qo = detail::attention_q(h, hd, g), ko = detail::attention_k(h, hd, g);
      for (index i = 0; i < Tn; ++i) {
        const T* q = qkv + (b * Tn + i) * row + qo;
        S mx = -std::numeric_limits<S>::infinity();
        for (index j = 0; j <= i; ++j) {
          const T* k = qkv + (b * Tn + j) * row + ko;
          S s = 0;
          for (index d = 0; d < hd; ++d) s += widen(q[d]) * widen(k[d]);
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        S sum = 0;
        for (index j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (index j = 0; j <= i; ++j) P[i * Tn + j] = narrow<T>(p[j] / sum);
        for (index j = i + 1; j < Tn; ++j) P[i * Tn + j] = narrow<T>(S(0));
        std::fill(o.begin(), o.end(), S(0));
        for (index j = 0; j <= i; ++j) {
          const T* v = qkv + (b * Tn + j) * row + ko + hd;
          const S pij = widen(P[i * Tn + j]);
          for (index d = 0; d < hd; ++d) o[d] += pij * widen(v[d]);
        }
        T* out_i = out + ((b * Tn + i) * H + h) * hd;
        for (index d = 0; d < hd; ++d) out_i[d] = narrow<T>(o[d]);
      }
    }
}

// dqkv (B, T, H/g, g + 2, hd) = gradient of the attention core, from dout (B, T, H, hd) and saved
// probs; accumulated in S (a group's keys and values over its g heads) and written once.
template <class T>
void attention_backward(T* dqkv_out, const T* dout, const T* qkv, const T* probs, index B, index Tn, index H,
                        index hd, index g = 1) {
  if constexpr (std::same_as<T, float>)
    return detail::attention_backward_gemm(dqkv_out, dout, qkv, probs, B, Tn, H, hd, g);
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
  for (index b = 0; b < B; ++b)
    for (index h = 0; h < H; ++h) {
      const T* P = probs + (b * H + h) * Tn * Tn;
      const index qo = detail::attention_q(h, hd, g), ko = detail::attention_k(h, hd, g);
      for (index i = 0; i < Tn; ++i) {
        const T* dout_i = dout + ((b * Tn + i) * H + h) * hd;
        const T* q = qkv + (b * Tn + i) * row + qo;
        S* dq = dqkv + (b * Tn + i) * row + qo;
        // dP_ij = dout_i . v_j; dv_j += P_ij dout_i; dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij).
        S dot = 0;
        for (index j = 0; j <= i; ++j) {
          const T* v = qkv + (b * Tn + j) * row + ko + hd;
          S dp = 0;
          for (index d = 0; d < hd; ++d) dp += widen(dout_i[d]) * widen(v[d]);
          dot += widen(P[i * Tn + j]) * dp;
        }
        for (index j = 0; j <= i; ++j) {
          const T* k = qkv + (b * Tn + j) * row + ko;
          const T* v = k + hd;
          S* dk = dqkv + (b * Tn + j) * row + ko;
          S* dv = dk + hd;
          S dp = 0;
          for (index d = 0; d < hd; ++d) dp += widen(dout_i[d]) * widen(v[d]);
          const S pij = widen(P[i * Tn + j]);
          const S ds = pij * (dp - dot) * scale;
          for (index d = 0; d < hd; ++d) {
            dq[d] += ds * widen(k[d]);
            dk[d] += ds * widen(q[d]);
            dv[d] += pij * widen(dout_i[d]);
          }
        }
      }
    }
  if constexpr (!std::same_as<T, S>)
    for (index i = 0; i < B * Tn * row; ++i) dqkv_out[i] = narrow<T>(dqkv[i]);
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

// Cross-entropy over vocab-sharded logits (N, V) holding vocabulary rows [begin, begin + V), of which
// the first `valid` are real (the rest pad the vocabulary to a multiple of the tensor degree and are
// masked out of the softmax). Three steps around two all-reduces (max, then sum of exponentials
// with the target logit packed beside it), statistics in S:
//   1. ce_row_max:   rowmax (N) = max over valid local logits (-inf if none)
//   2. ce_row_stats: stats (N, 2) = (sum exp(logit - max), target logit if the target is local else 0)
//   3. ce_loss:      sumexp (N) = stats[., 0]; returns sum_n log(sumexp_n) + max_n - target_n
//   4. ce_backward:  dlogits = scale (softmax - onehot)
template <class T, class S = accumulate_t<T>>
void ce_row_max(S* rowmax, const T* logits, index N, index V, index valid) {
  for (index n = 0; n < N; ++n) {
    S m = -std::numeric_limits<S>::infinity();
    for (index v = 0; v < valid; ++v) m = std::max(m, widen(logits[n * V + v]));
    rowmax[n] = m;
  }
}

template <class T, class S = accumulate_t<T>>
void ce_row_stats(S* stats, const T* logits, const S* rowmax, const std::int32_t* targets, index N, index V,
                  index valid, index begin) {
  std::vector<float, Eigen::aligned_allocator<float>> buf;
  for (index n = 0; n < N; ++n) {
    S s = 0;
    if constexpr (std::same_as<S, double>) {
      for (index v = 0; v < valid; ++v) s += std::exp(widen(logits[n * V + v]) - rowmax[n]);
    } else {  // Eigen's vectorized exp, then lane sums
      detail::exp_rows(buf, logits + n * V, valid, rowmax[n]);
      s = detail::lane_sum<S>(valid, [&](index v) { return buf[static_cast<std::size_t>(v)]; });
    }
    const index t = targets[n] - begin;
    stats[2 * n] = s;
    stats[2 * n + 1] = (t >= 0 && t < valid) ? widen(logits[n * V + t]) : S(0);
  }
}

template <class S>
double ce_loss(S* sumexp, const S* stats, const S* rowmax, index N) {
  double loss = 0;
  for (index n = 0; n < N; ++n) {
    sumexp[n] = stats[2 * n];
    loss += static_cast<double>(std::log(stats[2 * n]) + rowmax[n] - stats[2 * n + 1]);
  }
  return loss;
}

// dlogits (N, V) = scale (exp(logit - max) / sumexp - [v == target]); zero in padded columns.
template <class T, class S = accumulate_t<T>>
void ce_backward(T* dlogits, const T* logits, const S* rowmax, const S* sumexp, const std::int32_t* targets, index N,
                 index V, index valid, index begin, S scale) {
  std::vector<float, Eigen::aligned_allocator<float>> buf;
  for (index n = 0; n < N; ++n) {
    const index t = targets[n] - begin;
    if constexpr (std::same_as<S, double>) {
      for (index v = 0; v < V; ++v) {
        const S p = v < valid ? std::exp(widen(logits[n * V + v]) - rowmax[n]) / sumexp[n] : S(0);
        dlogits[n * V + v] = narrow<T>(scale * (p - (v == t ? S(1) : S(0))));
      }
    } else {
      detail::exp_rows(buf, logits + n * V, valid, rowmax[n]);
      const S inv = S(1) / sumexp[n];
      T* d = dlogits + n * V;
      for (index v = 0; v < valid; ++v) d[v] = narrow<T>(scale * (buf[static_cast<std::size_t>(v)] * inv));
      for (index v = valid; v < V; ++v) d[v] = narrow<T>(S(0));
      if (t >= 0 && t < valid) d[t] = narrow<T>(scale * (buf[static_cast<std::size_t>(t)] * inv - S(1)));
      else if (t >= valid && t < V) d[t] = narrow<T>(-scale);  // as the loop above: a target in the padding
    }
  }
}

// AdamW over n elements: parameters p, gradients g times grad_scale (the clipping factor), state
// m, v in S (float for float parameters, double for double). See math::adamw_step.
template <class P, class S>
void adamw(P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay, double grad_scale = 1.0) {
  for (index i = 0; i < n; ++i)
    math::adamw_step(p[i], static_cast<S>(static_cast<double>(g[i]) * grad_scale), m[i], v[i], a, decay);
}

// SGD with momentum over n elements (PyTorch's form): d = g grad_scale (+ wd p where decayed);
// buf = momentum buf + d; p -= lr buf.
template <class P, class S>
void sgd(P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay, bool decay,
         double grad_scale = 1.0) {
  for (index i = 0; i < n; ++i) {
    double d = static_cast<double>(g[i]) * grad_scale;
    if (decay) d += weight_decay * static_cast<double>(p[i]);
    buf[i] = static_cast<S>(momentum * static_cast<double>(buf[i]) + d);
    p[i] = static_cast<P>(static_cast<double>(p[i]) - lr * static_cast<double>(buf[i]));
  }
}

// Sum of squares of n elements, accumulated in double (the reference for the global gradient norm).
template <class T>
double sum_squares(const T* x, index n) {
  return detail::lane_sum<double>(n, [&](index i) { return static_cast<double>(x[i]) * static_cast<double>(x[i]); });
}

}  // namespace weft::host
