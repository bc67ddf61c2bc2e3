// LayerNorm over the last dim of an activation in layout A (Replicate, or Shard<1> under sequence
// parallelism). Weight and bias (C) are replicated on the tensor axis. Under Replicate every tensor
// rank computes identical parameter gradients; under Shard<1> each rank's are partial sums over its
// sequence slice: their layout is Partial on the tensor axis, and the data-parallel step reduces
// them once per step with the other gradients.
#pragma once

#include <string>

#include "weft/device/dispatch.hpp"
#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"

namespace weft::nn {

template <Floating T, LayoutType A>
class LayerNorm {
 public:
  using In = A;
  using Out = A;
  using GradIn = A;
  using GradOut = A;

  struct Ctx {
    Tensor<T, A, Host> x;
    Allocation stats;  // (2, rows): mean, then rstd; counted as activations
  };

  Param<T, Replicated, replicated_param_grad<A>> weight, bias;  // (C)
  T eps = T(1e-5);

  LayerNorm() = default;
  LayerNorm(Host& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed)
      : weight(dev, {C}, s, id, {Init::ones}, seed), bias(dev, {C}, s, id + 1, {Init::zeros}, seed) {}

  Tensor<T, A, Host> forward(Ctx& ctx, const Tensor<T, A, Host>& x) {
    const std::int64_t C = x.local_shape()[2], N = x.numel() / C;
    auto y = Tensor<T, A, Host>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    ctx.stats = x.dev().allocate(2 * N * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    T* stats = static_cast<T*>(ctx.stats.data());
    Ops<Host>::layernorm_forward(x.dev(), y.data(), stats, stats + N, x.data(), weight.value.data(), bias.value.data(), N, C, eps);
    ctx.x = x.clone(Category::activations);
    return y;
  }

  // dy in A (the gradient of a Replicate activation is Replicate) -> dx in A.
  Tensor<T, A, Host> backward(Ctx& ctx, const Tensor<T, A, Host>& dy) {
    const std::int64_t C = dy.local_shape()[2], N = dy.numel() / C;
    auto dx = Tensor<T, A, Host>::empty(dy.dev(), dy.global_shape(), dy.spread(), Category::activations);
    const T* stats = static_cast<const T*>(ctx.stats.data());
    Ops<Host>::layernorm_backward(dy.dev(), dx.data(), weight.grad.data(), bias.grad.data(), dy.data(), ctx.x.data(),
                             weight.value.data(), stats, stats + N, N, C);
    ctx = Ctx{};
    return dx;
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "LayerNorm"; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + ".weight", weight);
    f(prefix + ".bias", bias);
  }

};

}  // namespace weft::nn
