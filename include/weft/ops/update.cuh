// ops::Update and ops::Norm on the Cuda device (see update.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "weft/device/cuda/kernels/update.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/update.hpp"

namespace weft::ops {

template <>
struct Update<Cuda> {
  template <class P, class S>
  static void adamw(Cuda& d, P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay,
                    double grad_scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float> && std::same_as<S, float>,
                  "ops::Update<Cuda>::adamw: the GPU updates f32 parameters (master weights under bf16)");
    cuda::adamw_range(d, p, g, m, v, n, a, decay, grad_scale);
  }

  template <class P, class S>
  static void sgd(Cuda& d, P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay,
                  bool decay, double grad_scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float> && std::same_as<S, float>,
                  "ops::Update<Cuda>::sgd: the GPU updates f32 parameters");
    cuda::sgd_range(d, p, g, buf, n, lr, momentum, weight_decay, decay, grad_scale);
  }

  // AdamW over every range of a step in one launch (Piece: p, g, state {m, v}, n, decay).
  template <class Pieces>
  static void adamw_many(Cuda& d, const Pieces& pieces, const math::AdamW& a, double grad_scale) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    std::vector<cuda::TensorRef> refs;
    for (const auto& x : pieces) refs.push_back({x.p, x.g, x.state[0], x.state[1], x.n, x.decay ? 1 : 0});
    cuda::adamw(d, refs, a, static_cast<float>(grad_scale));
  }
};

template <>
struct Norm<Cuda> {
  static double sum_squares_many(Cuda& d, std::span<const std::pair<const float*, index>> pieces) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    std::vector<cuda::TensorRef> refs;
    for (const auto& [p, n] : pieces) refs.push_back({.p = const_cast<float*>(p), .n = n});
    return cuda::sum_squares(d, refs);
  }

  static double sum_squares(Cuda& d, const float* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    const cuda::TensorRef r{.p = const_cast<float*>(x), .n = n};
    return cuda::sum_squares(d, std::span<const cuda::TensorRef>(&r, 1));
  }
};

}  // namespace weft::ops
