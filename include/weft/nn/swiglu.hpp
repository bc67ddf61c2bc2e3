// SwiGlu: the gated unit between a SwiGLU MLP's fused gate-up projection and its down projection
// (ops/swiglu.hpp), on the tensor-sharded features:
//
//   a (B, T, 2F) Shard<-1>: (F, 2) pairs of gate and up, a shard of whole pairs per tensor rank
//   y (B, T, F)  Shard<-1>: silu(gate) up
//
// Llama's MLP is Sequential<gate_up (ColumnParallel C -> 2F), SwiGlu, down (RowParallel F -> C)>.
#pragma once

#include <string>

#include "weft/core/error.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/swiglu.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::nn {

template <Floating T, class D = Host>
class SwiGlu : public SameLayout<act::Features> {
 public:
  struct Ctx {
    Tensor<T, act::Features, D> a;  // (B, T, 2F) the gate-up activation, kept for backward
  };

  Tensor<T, act::Features, D> forward(Ctx& ctx, const Tensor<T, act::Features, D>& a) {
    auto y =
        Tensor<T, act::Features, D>::empty(a.dev(), out_shape(a.global_shape()), a.spread(), Category::activations);
    ops::SwiGlu<D>::forward(a.dev(), y.data(), a.data(), y.numel());
    ctx.a = a.clone(Category::activations);
    return y;
  }
  Tensor<T, act::Features, D> backward(Ctx& ctx, const Tensor<T, act::Features, D>& dy) {
    auto da = Tensor<T, act::Features, D>::empty(dy.dev(), ctx.a.global_shape(), dy.spread(), Category::activations);
    ops::SwiGlu<D>::backward(dy.dev(), da.data(), ctx.a.data(), dy.data(), dy.numel());
    ctx = Ctx{};
    return da;
  }

  Shape out_shape(const Shape& s) const {
    const int last = s.rank() - 1;
    if (last < 0 || s[last] % 2 != 0)
      throw Error("SwiGlu", cat("the gate-up activation has ", last < 0 ? 0 : s[last], " features, not pairs"),
                  "give it a gate-up projection of twice the hidden width");
    Shape o = s;
    o[last] /= 2;
    return o;
  }
  static std::string name() { return "SwiGlu"; }
  template <class F>
  void for_each_param(const std::string&, F&&) {}
};

}  // namespace weft::nn
