// ops::CrossEntropy: the vocab-parallel cross-entropy over logits (N, V) with `valid` real columns from `begin`:
// row maxima, row statistics (sum of exp, target logit), the loss sum, and the gradient.
//
//   loss = sum over rows of (log sum_j exp(logit_j - max) + max - logit_target), in acc<T>
//   dlogits = (softmax(logits) - onehot(target)) grad_scale         logits, dlogits (N, V) vocab-sharded
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in cross_entropy.cuh.
// Layers call ops::CrossEntropy<D>::row_max(dev, ...).
//
// defines: ops::CrossEntropy (Host, Meta), host::ce_row_max, host::ce_row_stats, host::ce_loss,
//   host::ce_backward
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

namespace weft::host {

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

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct CrossEntropy;

template <>
struct CrossEntropy<Host> {
  // Vocab-parallel cross-entropy over logits (N, V) with `valid` real columns from `begin`; the loss
  // sum over the rows comes back to the host.
  template <class T>
  static void row_max(Host&, acc<T>* rowmax, const T* logits, index N, index V, index valid) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, host::kRows,
                [&](index lo, index hi) { host::ce_row_max(rowmax + lo, logits + lo * V, hi - lo, V, valid); });
  }

  template <class T>
  static void row_stats(Host&, acc<T>* stats, const T* logits, const acc<T>* rowmax, const std::int32_t* targets,
                        index N, index V, index valid, index begin) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, host::kRows, [&](index lo, index hi) {
      host::ce_row_stats(stats + 2 * lo, logits + lo * V, rowmax + lo, targets + lo, hi - lo, V, valid, begin);
    });
  }

  template <class S>
  static double loss(Host&, S* sumexp, const S* stats, const S* rowmax, index N) {
    const host::Timed timed(host::Op::cross_entropy);
    return host::ce_loss(sumexp, stats, rowmax, N);
  }

  template <class T>
  static void backward(Host&, T* dlogits, const T* logits, const acc<T>* rowmax, const acc<T>* sumexp,
                       const std::int32_t* targets, index N, index V, index valid, index begin, acc<T> scale) {
    const host::Timed timed(host::Op::cross_entropy);
    host::split(N, host::kRows, [&](index lo, index hi) {
      host::ce_backward(dlogits + lo * V, logits + lo * V, rowmax + lo, sumexp + lo, targets + lo, hi - lo, V, valid,
                        begin, scale);
    });
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct CrossEntropy<Meta<D>> {
  template <class S, class T>
  static void row_max(Meta<D>& d, S*, const T*, index N, index V, index) {
    d.work.cross_entropy += 0.5 * static_cast<double>(N) * static_cast<double>(V);
  }
  template <class... A> static void row_stats(Meta<D>&, A&&...) {}
  template <class... A> static double loss(Meta<D>&, A&&...) { return 0; }
  template <class T, class S, class... A>
  static void backward(Meta<D>& d, T*, const T*, const S*, const S*, const std::int32_t*, index N, index V, A&&...) {
    d.work.cross_entropy += 0.5 * static_cast<double>(N) * static_cast<double>(V);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_CROSS_ENTROPY_INSTANCES(EXTERN, T)                                                                   \
  EXTERN template void weft::ops::CrossEntropy<weft::Host>::row_max<T>(weft::Host&, weft::accumulate_t<T>*, const T*,  \
                                                                       std::int64_t, std::int64_t, std::int64_t);      \
  EXTERN template void weft::ops::CrossEntropy<weft::Host>::row_stats<T>(                                              \
      weft::Host&, weft::accumulate_t<T>*, const T*, const weft::accumulate_t<T>*, const std::int32_t*, std::int64_t,  \
      std::int64_t, std::int64_t, std::int64_t);                                                                       \
  EXTERN template void weft::ops::CrossEntropy<weft::Host>::backward<T>(                                               \
      weft::Host&, T*, const T*, const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, const std::int32_t*,      \
      std::int64_t, std::int64_t, std::int64_t, std::int64_t, weft::accumulate_t<T>);                                  \
  EXTERN template void weft::host::ce_row_max<T, weft::accumulate_t<T>>(weft::accumulate_t<T>*, const T*,              \
                                                                        std::int64_t, std::int64_t, std::int64_t);     \
  EXTERN template void weft::host::ce_row_stats<T, weft::accumulate_t<T>>(                                             \
      weft::accumulate_t<T>*, const T*, const weft::accumulate_t<T>*, const std::int32_t*, std::int64_t, std::int64_t, \
      std::int64_t, std::int64_t);                                                                                     \
  EXTERN template void weft::host::ce_backward<T, weft::accumulate_t<T>>(                                              \
      T*, const T*, const weft::accumulate_t<T>*, const weft::accumulate_t<T>*, const std::int32_t*, std::int64_t,     \
      std::int64_t, std::int64_t, std::int64_t, weft::accumulate_t<T>);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_CROSS_ENTROPY_INSTANCES)
#define WEFT_HOST_CROSS_ENTROPY_PAIRS(EXTERN)                                                                   \
  EXTERN template double weft::ops::CrossEntropy<weft::Host>::loss<float>(weft::Host&, float*, const float*,    \
                                                                          const float*, std::int64_t);          \
  EXTERN template double weft::ops::CrossEntropy<weft::Host>::loss<double>(weft::Host&, double*, const double*, \
                                                                           const double*, std::int64_t);        \
  EXTERN template double weft::host::ce_loss<float>(float*, const float*, const float*, std::int64_t);          \
  EXTERN template double weft::host::ce_loss<double>(double*, const double*, const double*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_CROSS_ENTROPY_PAIRS)
