// Sequential<Layers...>: layers composed as types, with the layouts between them checked at compile
// time and the needed redistribution inserted.
//
// Between layer A and the next layer B:
//   forward   A::Out -> B::In         backward   B::GradIn -> A::GradOut
// Equal layouts need nothing. Otherwise the pair Redistribute<A::Out, B::In, B::GradIn, A::GradOut>
// is inserted, if both directions are redistributions (layout/transition.hpp) and the forward one does not
// create a feature shard: Shard<-1> on the tensor axis is a ColumnParallel layer's contract, never a
// redistribution's. So ColumnParallel -> RowParallel composes with nothing in between,
// RowParallel -> ColumnParallel gets Megatron's all-reduce pair, and RowParallel -> RowParallel
// (a partial sum into a layer that needs feature shards) is a compile error naming both layouts.
//
// A layer is an nn::Layer (layer.hpp: In, Out, GradIn, GradOut, Ctx, forward(ctx, x[, mesh]),
// backward(ctx, dy[, mesh]), out_shape(in_shape), name() and for_each_param(prefix, f)). Parameters are named by
// position
// ("prefix.1.weight"), or by the name a layer is given with Named<"attn", L> ("prefix.attn.qkv.weight").
// Residual adds no name of its own, inside a Sequential too (a block written as
// Sequential<Residual<...>, Residual<...>> names its parameters by the names inside the branches). Both pass a
// zero-bubble schedule's deferred weight pass (defer_weight, backward_weight) through to every layer that has one
// (detail::DefersWeight).
#pragma once

#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include "weft/nn/comm.hpp"
#include "weft/nn/layer.hpp"
#include "weft/nn/linear.hpp"

namespace weft::nn {

// A compile-time string, for layer names as template arguments.
template <std::size_t N>
struct Label {
  char text[N];
  constexpr Label(const char (&s)[N]) {  // NOLINT: implicit, so that Named<"ln1", L> reads well
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

// Named<"ln1", L>: layer L whose parameters are named "prefix.ln1.*" inside a Sequential.
template <Label N, Layer L>
class Named : public L {
 public:
  Named() = default;
  explicit Named(L l) : L(std::move(l)) {}
  static std::string label() { return N.text; }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    L::for_each_param(prefix + "." + N.text, f);
  }
};

namespace detail {

template <class T> inline constexpr bool is_named = false;
template <Label N, class L> inline constexpr bool is_named<Named<N, L>> = true;
// Named<N, L> itself (is_named also holds for wrappers that name their parameters as their layer).
template <class T> struct named_base {
  static constexpr bool named = false;
};
template <Label N, class L> struct named_base<Named<N, L>> {
  static constexpr bool named = true;
  using type = L;
};
template <class T> using named_base_t = typename named_base<T>::type;
template <class T> inline constexpr bool is_residual = false;

template <class P>
constexpr bool is_feature_shard() {
  if constexpr (IsShard<P>) return P::dim == -1;
  else return false;
}
template <LayoutType From, LayoutType To>
inline constexpr bool creates_feature_shard =
    is_feature_shard<typename To::tensor>() && !is_feature_shard<typename From::tensor>();

// The check between two adjacent layers, as a class template so the compiler's note names the layouts.
template <LayoutType Out, LayoutType In, LayoutType GradIn, LayoutType GradOut>
struct check_compose {
  static_assert(!creates_feature_shard<Out, In>,
                "Sequential: a layer's output layout does not match the next layer's input, and only a "
                "ColumnParallel layer may create a feature shard (Shard<-1>); put a ColumnParallel layer in "
                "between, or reduce the partial sum to Replicate first");
  static_assert(std::same_as<Out, In> || (Transition<Out, In>::possible && !Transition<Out, In>::uses_embed),
                "Sequential: no redistribution turns this layer's output layout into the next layer's input layout");
  static_assert(std::same_as<GradIn, GradOut> ||
                    (Transition<GradIn, GradOut>::possible && !Transition<GradIn, GradOut>::uses_embed),
                "Sequential: no redistribution turns the next layer's input gradient into this layer's output "
                "gradient layout");
  static constexpr bool ok = true;
};

// forward and backward are templates over the element type and device, so nn::Layer cannot check
// them where a layer is named; these say which member is missing where they are first called.
// A Named layer's errors name it (nn::within).
template <class L, class Ctx, class X, class M>
auto layer_forward(L& layer, Ctx& ctx, const X& x, M& mesh) {
  if constexpr (named_base<L>::named)
    return within([] { return L::label(); },
                  [&] { return layer_forward(static_cast<named_base_t<L>&>(layer), ctx, x, mesh); });
  else if constexpr (requires { layer.forward(ctx, x, mesh); }) return layer.forward(ctx, x, mesh);
  else if constexpr (requires { layer.forward(ctx, x); }) return layer.forward(ctx, x);
  else
    static_assert(sizeof(L) == 0,
                  "nn::Layer: the layer has no forward(ctx, x) or forward(ctx, x, mesh) for this input");
}
template <class L, class Ctx, class X, class M>
auto layer_backward(L& layer, Ctx& ctx, const X& dy, M& mesh) {
  if constexpr (named_base<L>::named)
    return within([] { return L::label(); },
                  [&] { return layer_backward(static_cast<named_base_t<L>&>(layer), ctx, dy, mesh); });
  else if constexpr (requires { layer.backward(ctx, dy, mesh); }) return layer.backward(ctx, dy, mesh);
  else if constexpr (requires { layer.backward(ctx, dy); }) return layer.backward(ctx, dy);
  else
    static_assert(sizeof(L) == 0,
                  "nn::Layer: the layer has no backward(ctx, dy) or backward(ctx, dy, mesh) for this gradient");
}

// A layer that can split its backward (zero-bubble schedules): defer_weight(on), and
// backward_weight(ctx) to add the deferred weight gradients. Layers without weights need neither.
template <class L>
concept DefersWeight = requires(L& l, typename L::Ctx& c) {
  l.defer_weight(true);
  l.backward_weight(c);
};
template <class L>
void set_defer_weight(L& layer, bool on) {
  if constexpr (DefersWeight<L>) layer.defer_weight(on);
}
template <class L>
void run_backward_weight(L& layer, typename L::Ctx& ctx) {
  if constexpr (DefersWeight<L>) layer.backward_weight(ctx);
}

template <class... Ls> struct first;
template <class L, class... Ls> struct first<L, Ls...> {
  using type = L;
};
template <class... Ls> struct last {
  using type = typename decltype((std::type_identity<Ls>{}, ...))::type;
};

}  // namespace detail

template <Layer... Layers>
class Sequential {
  static_assert(sizeof...(Layers) >= 1, "Sequential: needs at least one layer");
  using First = typename detail::first<Layers...>::type;
  using Last = typename detail::last<Layers...>::type;

 public:
  using In = typename First::In;
  using Out = typename Last::Out;
  using GradIn = typename First::GradIn;
  using GradOut = typename Last::GradOut;
  using Ctx = std::tuple<typename Layers::Ctx...>;

  std::tuple<Layers...> layers;

  explicit Sequential(Layers... ls) : layers(std::move(ls)...) { check<0>(); }

  template <Element T, class D, AxisComms M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh) {
    return forward_from<0>(ctx, x, mesh);
  }
  template <Element T, class D, AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh) {
    return backward_from<sizeof...(Layers) - 1>(ctx, dy, mesh, static_cast<const Tensor<T, GradIn, D>*>(nullptr));
  }
  // The same, with dresid added into the input gradient: by the first layer in its own pass where it
  // can (a LayerNorm fuses it), else afterwards (Residual's backward).
  template <Element T, class D, AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh,
                                const Tensor<T, GradIn, D>& dresid) {
    return backward_from<sizeof...(Layers) - 1>(ctx, dy, mesh, &dresid);
  }

  Shape out_shape(Shape s) const {
    std::apply([&](const auto&... l) { ((s = l.out_shape(s)), ...); }, layers);
    return s;
  }
  static std::string name() { return "Sequential"; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    for_each_layer([&](std::size_t i, auto& l) {
      using L = std::remove_cvref_t<decltype(l)>;
      if constexpr (detail::is_named<L> || detail::is_residual<L>) l.for_each_param(prefix, f);  // its own names
      else l.for_each_param(cat(prefix, ".", i), f);
    });
  }
  template <class F>
  void for_each_layer(F&& f) {
    std::size_t i = 0;
    std::apply([&](auto&... l) { (f(i++, l), ...); }, layers);
  }

  // Zero-bubble schedules: every layer that can defer its weight gradients (detail::defers_weight)
  // does so, and backward_weight adds them, layer by layer in order.
  void defer_weight(bool on) {
    std::apply([&](auto&... l) { (detail::set_defer_weight(l, on), ...); }, layers);
  }
  void backward_weight(Ctx& ctx) { backward_weight_from<0>(ctx); }

 private:
  template <std::size_t I>
  void backward_weight_from(Ctx& ctx) {
    if constexpr (I < sizeof...(Layers)) {
      detail::run_backward_weight(std::get<I>(layers), std::get<I>(ctx));
      backward_weight_from<I + 1>(ctx);
    }
  }

  template <std::size_t I>
  using layer_t = std::tuple_element_t<I, std::tuple<Layers...>>;

  template <std::size_t I>
  static constexpr void check() {
    if constexpr (I + 1 < sizeof...(Layers)) {
      using A = layer_t<I>;
      using B = layer_t<I + 1>;
      static_assert(
          detail::check_compose<typename A::Out, typename B::In, typename B::GradIn, typename A::GradOut>::ok);
      check<I + 1>();
    }
  }

  template <std::size_t I, Element T, class D, AxisComms M, LayoutType L>
  auto forward_from(Ctx& ctx, const Tensor<T, L, D>& x, M& mesh) {
    auto y = detail::layer_forward(std::get<I>(layers), std::get<I>(ctx), x, mesh);
    if constexpr (I + 1 == sizeof...(Layers)) {
      return y;
    } else {
      using A = layer_t<I>;
      using B = layer_t<I + 1>;
      if constexpr (std::same_as<typename A::Out, typename B::In>) return forward_from<I + 1>(ctx, y, mesh);
      else
        return forward_from<I + 1>(
            ctx,
            Redistribute<typename A::Out, typename B::In, typename B::GradIn, typename A::GradOut>::forward(y, mesh),
            mesh);
    }
  }

  template <std::size_t I, Element T, class D, AxisComms M, LayoutType L>
  auto backward_from(Ctx& ctx, const Tensor<T, L, D>& dy, M& mesh, const Tensor<T, GradIn, D>* dresid) {
    if constexpr (I == 0) {
      auto& first = std::get<0>(layers);
      if constexpr (requires { first.backward(std::get<0>(ctx), dy, dresid); }) {
        return first.backward(std::get<0>(ctx), dy, dresid);  // fused
      } else {
        auto dx = detail::layer_backward(first, std::get<0>(ctx), dy, mesh);
        if (dresid) ops::Memory<D>::add(dx.dev(), dx.data(), dresid->data(), dx.numel());
        return dx;
      }
    } else {
      auto dx = detail::layer_backward(std::get<I>(layers), std::get<I>(ctx), dy, mesh);
      using A = layer_t<I - 1>;
      using B = layer_t<I>;
      if constexpr (std::same_as<typename B::GradIn, typename A::GradOut>)
        return backward_from<I - 1>(ctx, dx, mesh, dresid);
      else
        return backward_from<I - 1>(
            ctx,
            Redistribute<typename A::Out, typename B::In, typename B::GradIn, typename A::GradOut>::backward(dx, mesh),
            mesh, dresid);
    }
  }
};

// Residual<Inner>: y = x + inner(x). Requires the inner layers to return to their input layout
// (end them with the reduction they need) so that the sum is of like with like.
template <Layer Inner>
class Residual {
  static_assert(std::same_as<typename Inner::In, typename Inner::Out>,
                "Residual: the inner layers' output layout differs from their input layout; end them with a "
                "redistribution back to the input layout (for a RowParallel output, ReduceFromTensor)");
  static_assert(std::same_as<typename Inner::GradIn, typename Inner::GradOut>,
                "Residual: the inner layers' input gradient layout differs from their output gradient layout");

 public:
  using In = typename Inner::In;
  using Out = In;
  using GradIn = typename Inner::GradIn;
  using GradOut = GradIn;
  using Ctx = typename Inner::Ctx;
  using inner_type = Inner;

  Inner inner;

  explicit Residual(Inner i) : inner(std::move(i)) {}

  template <Element T, class D, AxisComms M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh) {
    auto y = detail::layer_forward(inner, ctx, x, mesh);
    ops::Memory<D>::add(y.dev(), y.data(), x.data(), y.numel());
    return y;
  }
  // dx = dy + the inner layers' input gradient; the add is fused into the first inner layer's
  // backward where it can take it (a LayerNorm's), else a separate pass.
  template <Element T, class D, AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh) {
    if constexpr (requires { inner.backward(ctx, dy, mesh, dy); }) {
      return inner.backward(ctx, dy, mesh, dy);
    } else {
      auto dx = detail::layer_backward(inner, ctx, dy, mesh);
      ops::Memory<D>::add(dx.dev(), dx.data(), dy.data(), dx.numel());
      return dx;
    }
  }
  void defer_weight(bool on) { detail::set_defer_weight(inner, on); }
  void backward_weight(Ctx& ctx) { detail::run_backward_weight(inner, ctx); }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return cat("Residual<", Inner::name(), ">"); }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    inner.for_each_param(prefix, f);
  }
};

namespace detail {
template <Layer Inner> inline constexpr bool is_residual<Residual<Inner>> = true;
}  // namespace detail

}  // namespace weft::nn
