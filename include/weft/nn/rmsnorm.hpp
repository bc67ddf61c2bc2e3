// RmsNorm over the last dim of an activation in layout A (Replicate, or Shard<1> under sequence
// parallelism): y = x rstd w with rstd = 1 / sqrt(mean(x^2) + eps), Llama's norm. The weight (C) is
// replicated on the tensor axis, its gradient Partial on tensor under Shard<1> (each rank sums its
// own rows; the data-parallel step reduces it), as LayerNorm's.
//
//   x, y  (B, T, C) in A        rstd (B T) in acc<T>, kept for backward
#pragma once

#include <string>

#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/rmsnorm.hpp"

namespace weft::nn {

template <Floating T, LayoutType A, class D = Host>
class RmsNorm : public SameLayout<A> {
 public:
  using S = master_t<T>;  // statistics and the weight's gradient

  struct Ctx {
    Tensor<T, A, D> x;
    Allocation rstd;  // (rows) in S; counted as activations
  };

  Param<T, Replicated, replicated_param_grad<A>, D> weight;  // (C), ones
  S eps = S(1e-5);

  RmsNorm() = default;
  // The constructor every norm of weft's stages takes (TiedHeadStage's Norm); eps is set after.
  RmsNorm(D& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed, double eps_ = 1e-5)
      : weight(dev, {C}, s, id, {Init::ones}, seed, Decay::no), eps(static_cast<S>(eps_)) {}

  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x) {
    const std::int64_t C = x.local_shape()[2], N = x.numel() / C;
    auto y = Tensor<T, A, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    ctx.rstd = x.dev().allocate(N * static_cast<std::int64_t>(sizeof(S)), Category::activations);
    ops::RmsNorm<D>::forward(x.dev(), y.data(), static_cast<S*>(ctx.rstd.data()), x.data(), weight.value.data(), N, C,
                             eps);
    ctx.x = x.clone(Category::activations);
    return y;
  }

  // dy in A -> dx in A; with dresid (the gradient the residual stream adds), dx includes it.
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, const Tensor<T, A, D>* dresid = nullptr) {
    const std::int64_t C = dy.local_shape()[2], N = dy.numel() / C;
    auto dx = Tensor<T, A, D>::empty(dy.dev(), dy.global_shape(), dy.spread(), Category::activations);
    ops::RmsNorm<D>::backward(dy.dev(), dx.data(), weight.grad.data(), dy.data(), ctx.x.data(), weight.value.data(),
                              static_cast<const S*>(ctx.rstd.data()), N, C, dresid ? dresid->data() : nullptr);
    ctx = Ctx{};
    return dx;
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "RmsNorm"; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + ".weight", weight);
  }
};

}  // namespace weft::nn
