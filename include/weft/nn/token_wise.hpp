// TokenWise<L>: layer L (or a Sequential of layers) run on the rows of the sequence that a context
// rank holds. L must compute each token from that token alone: a norm, a projection, the MLP, an
// elementwise op, and the tensor-axis redistributions between them. Attention is not token-wise;
// it takes the context axis itself (GroupedQueryAttention's Cx).
//
// Under context parallelism (docs/context.md) an activation (B, T, C) is Shard<1> on the context
// axis: rank r holds T / c rows, the chunks r and 2c - 1 - r of context::Chunks. TokenWise's layouts
// are L's with that placement on the context axis, and it calls L on the rank's rows as on a
// sequence of T / c tokens of its own, whose results are the whole sequence's rows at those
// positions: the same storage, relabelled (Tensor::relabel), no copy and no collective.
//
//   x   (B, T, C)    In  = L::In with Shard<1> on context     local (B/dp, T/c, C)
//                    (L::In Shard<1> on tensor too, sequence parallelism: local (B/dp, T/(c tp), C))
//   L   sees (B, T/c, C) in L::In (Replicate on context)
//   y   (B, T, C')   Out = L::Out with Shard<1> on context
//
// Parameters stay Replicate on context; each context rank's weight gradients sum over its own rows,
// and the data-parallel reduction over data x context ranks (Mesh::data_context) completes them.
// Names, the fused residual gradient, the deferred weight pass (ZB-H1) and out_shape pass through.
#pragma once

#include <string>
#include <utility>

#include "weft/nn/sequential.hpp"

namespace weft::nn {

template <class L>
class TokenWise {
  static_assert(IsReplicate<typename L::In::context> && IsReplicate<typename L::Out::context> &&
                    IsReplicate<typename L::GradIn::context> && IsReplicate<typename L::GradOut::context>,
                "TokenWise: the layer already places the context axis; wrap only layers whose layouts are "
                "Replicate on context (the whole sequence)");

 public:
  // A's placements, with the sequence (dim 1) sharded over the context axis.
  template <LayoutType A>
  using on_rows = Layout<typename A::data, typename A::tensor, typename A::pipe, Shard<1>>;

  using In = on_rows<typename L::In>;
  using Out = on_rows<typename L::Out>;
  using GradIn = on_rows<typename L::GradIn>;
  using GradOut = on_rows<typename L::GradOut>;
  using Ctx = typename L::Ctx;
  using inner_type = L;

  L inner;

  TokenWise() = default;
  explicit TokenWise(L l) : inner(std::move(l)) {}

  template <Element T, class D, AxisComms M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh) {
    return whole<Out>(detail::layer_forward(inner, ctx, rows<typename L::In>(x), mesh), x.global_shape()[1]);
  }
  template <Element T, class D, AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh) {
    return whole<GradIn>(detail::layer_backward(inner, ctx, rows<typename L::GradOut>(dy), mesh), dy.global_shape()[1]);
  }
  // The residual's gradient added in L's own pass where L takes it (an RmsNorm or a LayerNorm first
  // in a Residual's branch; Sequential::backward_from).
  template <Element T, class D>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, const Tensor<T, GradIn, D>* dresid)
    requires requires(L& l, Ctx& c, const Tensor<T, typename L::GradOut, D>& g,
                      const Tensor<T, typename L::GradIn, D>* r) { l.backward(c, g, r); }
  {
    if (!dresid)
      return whole<GradIn>(inner.backward(ctx, rows<typename L::GradOut>(dy), nullptr), dy.global_shape()[1]);
    const auto r = rows<typename L::GradIn>(*dresid);
    return whole<GradIn>(inner.backward(ctx, rows<typename L::GradOut>(dy), &r), dy.global_shape()[1]);
  }

  void defer_weight(bool on) { detail::set_defer_weight(inner, on); }
  void backward_weight(Ctx& ctx) { detail::run_backward_weight(inner, ctx); }

  Shape out_shape(const Shape& s) const { return inner.out_shape(s); }
  static std::string name() { return cat("TokenWise<", L::name(), ">"); }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    inner.for_each_param(prefix, f);
  }

 private:
  // x's local rows as a tensor of their own: global (B, T/c, ...), Replicate on context (and split
  // over tensor as before where A shards the sequence there too: sequence parallelism).
  template <LayoutType A, Element T, LayoutType From, class D>
  static Tensor<T, A, D> rows(const Tensor<T, From, D>& x) {
    Shape g = x.global_shape();
    g[1] /= x.spread().context_degree;
    return Tensor<T, A, D>::view(x.dev(), const_cast<T*>(x.data()), g, x.spread());
  }
  // L's result on the rows, as the rows of a sequence of T: the same storage under layout A.
  template <LayoutType A, Element T, LayoutType From, class D>
  static Tensor<T, A, D> whole(Tensor<T, From, D>&& y, std::int64_t T_) {
    Shape g = y.global_shape();
    g[1] = T_;
    return Tensor<T, A, D>::relabel(std::move(y), g);
  }
};

namespace detail {
// Inside a Sequential, TokenWise<Named<"n", L>> names its parameters as Named<"n", L> does.
template <class L> inline constexpr bool is_named<TokenWise<L>> = is_named<L> || is_residual<L>;
}  // namespace detail

}  // namespace weft::nn
