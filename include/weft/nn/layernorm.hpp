// LayerNorm over the last dim of an activation in layout A (Replicate, or Shard<1> under sequence
// parallelism). Weight and bias (C) are replicated on the tensor axis. Under Replicate every tensor
// rank computes identical parameter gradients; under Shard<1> each rank's are partial sums over its
// sequence slice: their layout is Partial on the tensor axis, and the data-parallel step reduces
// them once per step with the other gradients.
//
// Normalize: the same without weight and bias, y = (x - mean) rstd (a DiT's norms, whose scale and
// shift come from the side input: nn::Modulation). It has no parameters; the op's weight and bias
// are a constant one and zero, and their gradients go to a scratch it keeps.
//
// defines: nn::LayerNorm, nn::Normalize
#pragma once

#include <string>

#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/all.hpp"

namespace weft::nn {

template <Floating T, LayoutType A, class D = Host>
class LayerNorm {
 public:
  using In = A;
  using Out = A;
  using GradIn = A;
  using GradOut = A;

  using S = master_t<T>;  // statistics and parameter gradients

  struct Ctx {
    Tensor<T, A, D> x;
    Allocation stats;  // (2, rows) in S: mean, then rstd; counted as activations
  };

  Param<T, Replicated, replicated_param_grad<A>, D> weight, bias;  // (C)
  S eps = S(1e-5);

  LayerNorm() = default;
  LayerNorm(D& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed)
      : weight(dev, {C}, s, id, {Init::ones}, seed, Decay::no),
        bias(dev, {C}, s, id + 1, {Init::zeros}, seed, Decay::no) {}

  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x) {
    const std::int64_t C = x.local_shape()[2], N = x.numel() / C;
    auto y = Tensor<T, A, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    ctx.stats = x.dev().allocate(2 * N * static_cast<std::int64_t>(sizeof(S)), Category::activations);
    S* stats = static_cast<S*>(ctx.stats.data());
    ops::LayerNorm<D>::forward(x.dev(), y.data(), stats, stats + N, x.data(), weight.value.data(), bias.value.data(), N,
                               C, eps);
    ctx.x = x.clone(Category::activations);
    return y;
  }

  // dy in A (the gradient of a Replicate activation is Replicate) -> dx in A. With dresid (the
  // gradient arriving at the residual stream that x also feeds), dx = the LayerNorm's input gradient
  // + dresid, in the same pass.
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, const Tensor<T, A, D>* dresid = nullptr) {
    const std::int64_t C = dy.local_shape()[2], N = dy.numel() / C;
    auto dx = Tensor<T, A, D>::empty(dy.dev(), dy.global_shape(), dy.spread(), Category::activations);
    const S* stats = static_cast<const S*>(ctx.stats.data());
    ops::LayerNorm<D>::backward(dy.dev(), dx.data(), weight.grad.data(), bias.grad.data(), dy.data(), ctx.x.data(),
                                weight.value.data(), stats, stats + N, N, C, dresid ? dresid->data() : nullptr);
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

template <Floating T, LayoutType A, class D = Host>
class Normalize : public SameLayout<A> {
 public:
  using S = master_t<T>;
  using Ctx = typename LayerNorm<T, A, D>::Ctx;

  S eps = S(1e-6);  // DiT's (diffusers' elementwise_affine=False norms)

  Normalize() = default;
  // LayerNorm's constructor, so that either is a stage's Norm; nothing is drawn. eps: DiT's
  // adaLN norms and final norm keep 1e-6; diffusers' norm before the MLP has its norm_eps (1e-5).
  Normalize(D& dev, std::int64_t C, const Spread& s, std::uint64_t = 0, std::uint64_t = 0, double e = 1e-6)
      : eps(static_cast<S>(e)),
        one_(Tensor<T, Replicated, D>::empty(dev, {C}, s, Category::other)),
        zero_(Tensor<T, Replicated, D>::zeros(dev, {C}, s, Category::other)),
        scratch_(Tensor<S, Replicated, D>::zeros(dev, {2, C}, s, Category::other)) {
    ops::Memory<D>::fill(dev, one_.data(), C, T(1));
  }

  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x) {
    const std::int64_t C = x.local_shape()[2], N = x.numel() / C;
    auto y = Tensor<T, A, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    ctx.stats = x.dev().allocate(2 * N * static_cast<std::int64_t>(sizeof(S)), Category::activations);
    S* stats = static_cast<S*>(ctx.stats.data());
    ops::LayerNorm<D>::forward(x.dev(), y.data(), stats, stats + N, x.data(), one_.data(), zero_.data(), N, C, eps);
    ctx.x = x.clone(Category::activations);
    return y;
  }
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, const Tensor<T, A, D>* dresid = nullptr) {
    const std::int64_t C = dy.local_shape()[2], N = dy.numel() / C;
    auto dx = Tensor<T, A, D>::empty(dy.dev(), dy.global_shape(), dy.spread(), Category::activations);
    const S* stats = static_cast<const S*>(ctx.stats.data());
    ops::LayerNorm<D>::backward(dy.dev(), dx.data(), scratch_.data(), scratch_.data() + C, dy.data(), ctx.x.data(),
                                one_.data(), stats, stats + N, N, C, dresid ? dresid->data() : nullptr);
    ctx = Ctx{};
    return dx;
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Normalize"; }
  template <class F>
  void for_each_param(const std::string&, F&&) {}

 private:
  Tensor<T, Replicated, D> one_, zero_;  // (C): the op's weight and bias
  Tensor<S, Replicated, D> scratch_;     // (2, C): where the op adds their gradients
};

}  // namespace weft::nn
