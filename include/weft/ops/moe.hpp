// ops::Route, ops::Dispatch: the token routing of a mixture-of-experts layer (nn/moe.hpp) around its
// experts' GEMMs: the router's scores and top-k, the router's losses' statistics, and the moves of
// token rows to the experts' contiguous blocks and back.
//
//   Route::forward    logits (N, E) S -> probs (N, E) the scores (softmax or sigmoid: the rule's),
//                     index (N, k) int32 the k largest of probs + bias (bias (E) null: none; ties to
//                     the lower expert), weight (N, k) their scores (divided by their sum where
//                     renormalised, times the rule's scale), norm (N): logsumexp of the logits
//                     (softmax) or the scores' sum (sigmoid) (math::route_row)
//   Route::stats      counts (E) the slots routed to each expert, psum (E) the sum over the tokens of
//                     each expert's share (softmax: its probability; sigmoid: its score over the
//                     row's sum), and the sum of lse^2 (softmax): what the load-balancing loss and the
//                     z-loss need (summed over the ranks that hold other tokens), in double
//   Route::backward   dlogits (N, E) from dweight (N, k) (the combine's), the load-balancing loss's
//                     gradient per expert (dL/dshare[n, e] = aux[e], the same for every token) and the
//                     z-loss's (dL/dlse[n] = z lse[n])
//   Dispatch::gather  xp (M, C): xp[m] = x[rows[m]], the tokens' rows in the experts' order
//   Dispatch::combine y (N, C) (+)= sum over j of weight[n, j] xp[slot[n, j]] (weight null: 1), the
//                     slots of dropped tokens (-1) skipped: the weighted combine, and (weight null) the
//                     gather's backward
//   Dispatch::combine_backward   dxp[slot[n, j]] = weight[n, j] dy[n], dweight[n, j] = dy[n] . yp[slot[n, j]]
//                     (0 where dropped)
//
// Probabilities and weights in S = acc<T>; each row on its own (the same bits on any number of
// threads; the per-token math is math::route_row, shared with the GPU). An op (ops/op.hpp): the
// host's here, the Meta device's below, the Cuda device's in moe.cuh.
//
// defines: ops::Route (Host, Meta), ops::Dispatch (Host, Meta)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::ops {

template <class D>
struct Route;
template <class D>
struct Dispatch;

template <>
struct Route<Host> {
  static constexpr index max_experts = math::kMaxExperts;

  template <class S>
  static void forward(Host&, S* probs, std::int32_t* idx, S* weight, S* norm, const S* logits, const S* bias, index N,
                      index E, index k, const math::RouteRule<S>& rule) {
    const host::Timed timed(host::Op::elementwise);
    host::split(N, host::kRows, [&](index lo, index hi) {
      for (index n = lo; n < hi; ++n)
        norm[n] = math::route_row(probs + n * E, idx + n * k, weight + n * k, logits + n * E, bias, E, k, rule);
    });
  }

  // counts (E), psum (E) and the sum of lse^2, added to (double: exact counts, sums in a fixed order).
  template <class S>
  static void stats(Host&, double* counts, double* psum, double* lse2, const S* probs, const std::int32_t* idx,
                    const S* norm, index N, index E, index k, math::Score score) {
    const bool sigmoid = score == math::Score::sigmoid;
    for (index n = 0; n < N; ++n) {
      for (index j = 0; j < k; ++j) counts[idx[n * k + j]] += 1;
      const double u = static_cast<double>(norm[n]);
      for (index e = 0; e < E; ++e)
        psum[e] += sigmoid ? static_cast<double>(probs[n * E + e]) / u : static_cast<double>(probs[n * E + e]);
      if (!sigmoid) *lse2 += u * u;
    }
  }

  template <class T, class S>
  static void backward(Host&, T* dlogits, const S* dweight, const S* probs, const std::int32_t* idx, const S* weight,
                       const S* norm, index N, index E, index k, const math::RouteRule<S>& rule, const S* aux, S z) {
    const host::Timed timed(host::Op::elementwise);
    host::split(N, host::kRows, [&](index lo, index hi) {
      S g[math::kMaxExperts];
      for (index n = lo; n < hi; ++n) {
        math::route_row_backward(g, dweight ? dweight + n * k : nullptr, probs + n * E, idx + n * k, weight + n * k,
                                 norm[n], E, k, rule, aux, z);
        for (index e = 0; e < E; ++e) dlogits[n * E + e] = narrow<T>(g[e]);
      }
    });
  }
};

template <>
struct Dispatch<Host> {
  template <class T>
  static void gather(Host&, T* xp, const T* x, const std::int32_t* rows, index M, index C) {
    const host::Timed timed(host::Op::memory);
    host::split(M, host::kRows, [&](index lo, index hi) {
      for (index m = lo; m < hi; ++m) std::copy_n(x + rows[m] * C, C, xp + m * C);
    });
  }

  // y (N, C) = (accumulate ? y : 0) + sum_j weight[n, j] xp[slot[n, j]], in acc<T> per element.
  template <class T, class S>
  static void combine(Host&, T* y, const T* xp, const std::int32_t* slot, const S* weight, index N, index k, index C,
                      bool accumulate) {
    const host::Timed timed(host::Op::memory);
    host::split(N, host::kRows, [&](index lo, index hi) {
      for (index n = lo; n < hi; ++n)
        for (index c = 0; c < C; ++c) {
          acc<T> s = accumulate ? widen(y[n * C + c]) : acc<T>(0);
          for (index j = 0; j < k; ++j) {
            const std::int32_t m = slot[n * k + j];
            if (m < 0) continue;
            const acc<T> v = widen(xp[m * C + c]);
            s += weight ? static_cast<acc<T>>(weight[n * k + j]) * v : v;
          }
          y[n * C + c] = narrow<T>(s);
        }
    });
  }

  template <class T, class S>
  static void combine_backward(Host&, T* dxp, S* dweight, const T* dy, const T* xp, const std::int32_t* slot,
                               const S* weight, index N, index k, index C) {
    const host::Timed timed(host::Op::memory);
    host::split(N, host::kRows, [&](index lo, index hi) {
      for (index n = lo; n < hi; ++n)
        for (index j = 0; j < k; ++j) {
          const std::int32_t m = slot[n * k + j];
          if (m < 0) {
            dweight[n * k + j] = 0;
            continue;
          }
          acc<T> dot = 0;
          const auto w = static_cast<acc<T>>(weight[n * k + j]);
          for (index c = 0; c < C; ++c) {
            const acc<T> g = widen(dy[n * C + c]);
            dot += g * widen(xp[m * C + c]);
            dxp[m * C + c] = narrow<T>(w * g);
          }
          dweight[n * k + j] = static_cast<S>(dot);
        }
    });
  }
};

// The Meta device (cost/measure.hpp): nothing computed, and no work noted (the time model prices the
// experts' GEMMs, which nn::MoeMlp runs through ops::Gemm; the routing and the moves, O(N E) and
// O(N k C), are not priced yet).
template <class D>
struct Route<Meta<D>> {
  static constexpr index max_experts = math::kMaxExperts;
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void stats(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct Dispatch<Meta<D>> {
  template <class... A> static void gather(Meta<D>&, A&&...) {}
  template <class... A> static void combine(Meta<D>&, A&&...) {}
  template <class... A> static void combine_backward(Meta<D>&, A&&...) {}
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_MOE_INSTANCES(EXTERN, T)                                                                            \
  EXTERN template void weft::ops::Route<weft::Host>::backward<T, weft::accumulate_t<T>>(                              \
      weft::Host&, T*, const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, const std::int32_t*,               \
      const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, std::int64_t, std::int64_t, std::int64_t,           \
      const weft::math::RouteRule<weft::accumulate_t<T>>&, const weft::accumulate_t<T>*, weft::accumulate_t<T>);      \
  EXTERN template void weft::ops::Dispatch<weft::Host>::gather<T>(weft::Host&, T*, const T*, const std::int32_t*,     \
                                                                  std::int64_t, std::int64_t);                        \
  EXTERN template void weft::ops::Dispatch<weft::Host>::combine<T, weft::accumulate_t<T>>(                            \
      weft::Host&, T*, const T*, const std::int32_t*, const weft::accumulate_t<T>*, std::int64_t, std::int64_t,       \
      std::int64_t, bool);                                                                                            \
  EXTERN template void weft::ops::Dispatch<weft::Host>::combine_backward<T, weft::accumulate_t<T>>(                   \
      weft::Host&, T*, weft::accumulate_t<T>*, const T*, const T*, const std::int32_t*, const weft::accumulate_t<T>*, \
      std::int64_t, std::int64_t, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_MOE_INSTANCES)
#define WEFT_HOST_MOE_PAIRS(EXTERN)                                                                                    \
  EXTERN template void weft::ops::Route<weft::Host>::forward<float>(                                                   \
      weft::Host&, float*, std::int32_t*, float*, float*, const float*, const float*, std::int64_t, std::int64_t,      \
      std::int64_t, const weft::math::RouteRule<float>&);                                                              \
  EXTERN template void weft::ops::Route<weft::Host>::stats<float>(                                                     \
      weft::Host&, double*, double*, double*, const float*, const std::int32_t*, const float*, std::int64_t,           \
      std::int64_t, std::int64_t, weft::math::Score);                                                                  \
  EXTERN template void weft::ops::Route<weft::Host>::forward<double>(                                                  \
      weft::Host&, double*, std::int32_t*, double*, double*, const double*, const double*, std::int64_t, std::int64_t, \
      std::int64_t, const weft::math::RouteRule<double>&);                                                             \
  EXTERN template void weft::ops::Route<weft::Host>::stats<double>(                                                    \
      weft::Host&, double*, double*, double*, const double*, const std::int32_t*, const double*, std::int64_t,         \
      std::int64_t, std::int64_t, weft::math::Score);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_MOE_PAIRS)
