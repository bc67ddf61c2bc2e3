// ops::Update and ops::Norm: the optimizer's AdamW and SGD updates over ranges of a unit's buffers (one range, or many
// in one call), with the gradient scaled by grad_scale; the sum of squares behind the global norm.
//
//   AdamW:  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr (m^ / (sqrt(v^) + eps) + wd p),
//           m^ = m / (1 - b1^t), v^ = v / (1 - b2^t) (math.hpp)
//   SGD:    b = momentum b + g (+ wd p);  p -= lr b;   g = grad grad_scale;  sum_squares: sum x^2 in double
//   sign_step: p -= rate sign(g) (sign(0) = 0): a routing bias's step (nn::SignStep), by the load in g
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in update.cuh.
// Layers call ops::Update<D>::adamw(dev, ...).
//
// defines: ops::Norm (Host, Meta), ops::Update (Host, Meta), host::adamw, host::sgd, host::sum_squares
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/math.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

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

namespace weft::ops {

template <class D>
struct Update;

template <class D>
struct Norm;

template <>
struct Update<Host> {
  // One range of n elements, the gradient scaled by grad_scale.
  template <class P, class S>
  static void adamw(Host&, P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay,
                    double grad_scale) {
    const host::Timed timed(host::Op::optimizer);
    host::split(n, host::kElements, [&](index lo, index hi) {
      host::adamw(p + lo, g + lo, m + lo, v + lo, hi - lo, a, decay, grad_scale);
    });
  }

  template <class P, class S>
  static void sgd(Host&, P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay, bool decay,
                  double grad_scale) {
    const host::Timed timed(host::Op::optimizer);
    host::sgd(p, g, buf, n, lr, momentum, weight_decay, decay, grad_scale);
  }

  template <class P>
  static void sign_step(Host&, P* p, const P* g, index n, double rate) {
    const host::Timed timed(host::Op::optimizer);
    for (index i = 0; i < n; ++i) p[i] = static_cast<P>(static_cast<double>(p[i]) - rate * math::sign(g[i]));
  }

  // AdamW over several ranges (Piece in optim/optimizer.hpp: p, g, state {m, v}, n, decay).
  template <class Pieces, class S>
  static void adamw_many(Host&, const Pieces& pieces, const math::AdamWParams<S>& a, double grad_scale) {
    const host::Timed timed(host::Op::optimizer);
    if (host::threads() == 1) {
      for (const auto& x : pieces) host::adamw(x.p, x.g, x.state[0], x.state[1], x.n, a, x.decay, grad_scale);
      return;
    }
    // Every piece cut into ranges of host::kElements, the ranges dealt out to the threads.
    struct Range {
      std::size_t piece;
      index lo, hi;
    };
    std::vector<Range> ranges;
    for (std::size_t i = 0; i < std::size(pieces); ++i)
      for (index lo = 0; lo < pieces[i].n; lo += host::kElements)
        ranges.push_back({i, lo, std::min(pieces[i].n, lo + host::kElements)});
    host::parallel(static_cast<index>(ranges.size()), [&](index r) {
      const Range& q = ranges[static_cast<std::size_t>(r)];
      const auto& x = pieces[q.piece];
      host::adamw(x.p + q.lo, x.g + q.lo, x.state[0] + q.lo, x.state[1] + q.lo, q.hi - q.lo, a, x.decay, grad_scale);
    });
  }
};

template <>
struct Norm<Host> {
  // The sum of squares (in double) behind the global norm.
  template <class T>
  static double sum_squares(Host&, const T* x, index n) {
    const host::Timed timed(host::Op::norm);
    return host::sum_squares(x, n);
  }

  // Several ranges, each cut into blocks of host::kElements from its start: every block's sum of squares
  // (host::sum_squares), then the blocks' sums added in order, ranges in order. The blocks are
  // fixed by the sizes alone, so the threads that run them do not change the bits.
  template <class T>
  static double sum_squares_many(Host&, std::span<const std::pair<const T*, index>> pieces) {
    const host::Timed timed(host::Op::norm);
    std::vector<std::pair<const T*, index>> blocks;
    for (const auto& [p, n] : pieces)
      for (index lo = 0; lo < n; lo += host::kElements) blocks.emplace_back(p + lo, std::min(host::kElements, n - lo));
    std::vector<double> sums(blocks.size());
    host::parallel(static_cast<index>(blocks.size()), [&](index b) {
      const auto& [p, n] = blocks[static_cast<std::size_t>(b)];
      sums[static_cast<std::size_t>(b)] = host::sum_squares(p, n);
    });
    double s = 0;
    for (double x : sums) s += x;
    return s;
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct Update<Meta<D>> {
  template <class P, class G, class S, class... A>
  static void adamw(Meta<D>& d, P*, const G*, S*, S*, index n, A&&...) {
    d.work.adamw += static_cast<double>(n);
  }
  template <class... A> static void sgd(Meta<D>&, A&&...) {}
  template <class... A> static void sign_step(Meta<D>&, A&&...) {}
  template <class Pieces, class... A>
  static void adamw_many(Meta<D>& d, const Pieces& pieces, A&&...) {
    for (const auto& x : pieces) d.work.adamw += static_cast<double>(x.n);
  }
};

template <class D>
struct Norm<Meta<D>> {
  template <class... A> static double sum_squares(Meta<D>&, A&&...) { return 0; }
  template <class... A> static double sum_squares_many(Meta<D>&, A&&...) { return 0; }
};

}  // namespace weft::ops

// The Host kernels' instances (the optimizer's in f32 and f64: it updates master weights), compiled
// once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_UPDATE_PAIRS(EXTERN)                                                                                \
  EXTERN template void weft::ops::Update<weft::Host>::adamw<float, float>(                                            \
      weft::Host&, float*, const float*, float*, float*, std::int64_t, const weft::math::AdamWParams<float>&, bool,   \
      double);                                                                                                        \
  EXTERN template void weft::ops::Update<weft::Host>::sgd<float, float>(                                              \
      weft::Host&, float*, const float*, float*, std::int64_t, double, double, double, bool, double);                 \
  EXTERN template void weft::ops::Update<weft::Host>::sign_step<float>(weft::Host&, float*, const float*,             \
                                                                       std::int64_t, double);                         \
  EXTERN template double weft::ops::Norm<weft::Host>::sum_squares<float>(weft::Host&, const float*, std::int64_t);    \
  EXTERN template double weft::ops::Norm<weft::Host>::sum_squares_many<float>(                                        \
      weft::Host&, std::span<const std::pair<const float*, std::int64_t>>);                                           \
  EXTERN template void weft::host::adamw<float, float>(float*, const float*, float*, float*, std::int64_t,            \
                                                       const weft::math::AdamWParams<float>&, bool, double);          \
  EXTERN template void weft::ops::Update<weft::Host>::adamw<double, double>(                                          \
      weft::Host&, double*, const double*, double*, double*, std::int64_t, const weft::math::AdamWParams<double>&,    \
      bool, double);                                                                                                  \
  EXTERN template void weft::ops::Update<weft::Host>::sgd<double, double>(                                            \
      weft::Host&, double*, const double*, double*, std::int64_t, double, double, double, bool, double);              \
  EXTERN template void weft::ops::Update<weft::Host>::sign_step<double>(weft::Host&, double*, const double*,          \
                                                                        std::int64_t, double);                        \
  EXTERN template double weft::ops::Norm<weft::Host>::sum_squares<double>(weft::Host&, const double*, std::int64_t);  \
  EXTERN template double weft::ops::Norm<weft::Host>::sum_squares_many<double>(                                       \
      weft::Host&, std::span<const std::pair<const double*, std::int64_t>>);                                          \
  EXTERN template void weft::host::adamw<double, double>(double*, const double*, double*, double*, std::int64_t,      \
                                                         const weft::math::AdamWParams<double>&, bool, double);       \
  EXTERN template void weft::host::sgd<float, float>(float*, const float*, float*, std::int64_t, double, double,      \
                                                     double, bool, double);                                           \
  EXTERN template double weft::host::sum_squares<float>(const float*, std::int64_t);                                  \
  EXTERN template void weft::host::sgd<double, double>(double*, const double*, double*, std::int64_t, double, double, \
                                                       double, bool, double);                                         \
  EXTERN template double weft::host::sum_squares<double>(const double*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_UPDATE_PAIRS)
