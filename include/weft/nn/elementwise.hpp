// Elementwise<Op, T, L>: a layer that applies an elementwise op (ops/op.hpp) to every
// element of an activation in layout L, and its gradient: weft's or a user's, with
//
//   Op<D>::forward(dev, y, x, n)          y = f(x)
//   Op<D>::backward(dev, dx, x, dy, n)    dx = f'(x) dy
//
// It keeps its input for backward (Category::activations) and has no parameters, so any layout
// works: it acts on whatever each rank holds (between a ColumnParallel and a RowParallel Linear,
// act::Features). examples/03_custom_model.hpp puts a user's ReLU squared in an MLP with it.
#pragma once

#include <string>

#include "weft/layout/layout.hpp"
#include "weft/nn/roles.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::nn {

template <template <class> class Op, Element T, LayoutType L, class D = Host>
class Elementwise : public SameLayout<L> {
 public:
  struct Ctx {
    Tensor<T, L, D> x;
  };

  Tensor<T, L, D> forward(Ctx& ctx, const Tensor<T, L, D>& x) {
    auto y = Tensor<T, L, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    Op<D>::forward(x.dev(), y.data(), x.data(), x.numel());
    ctx.x = x.clone(Category::activations);
    return y;
  }
  Tensor<T, L, D> backward(Ctx& ctx, const Tensor<T, L, D>& dy) {
    auto dx = Tensor<T, L, D>::empty(dy.dev(), dy.global_shape(), dy.spread(), Category::activations);
    Op<D>::backward(dy.dev(), dx.data(), ctx.x.data(), dy.data(), dy.numel());
    ctx = Ctx{};
    return dx;
  }
  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Elementwise"; }
  template <class F>
  void for_each_param(const std::string&, F&&) {}
};

}  // namespace weft::nn
