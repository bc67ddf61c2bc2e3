// Either<A, B>: a layer that is A or B, chosen when it is built, for the blocks of a model whose
// layers differ by position though a model's blocks share one type (nn::ModelSpec's Block): Qwen3-MoE's
// MLP, dense in the layers its config names and a mixture of experts in the others
// (models/qwen3_moe/model.hpp).
//
//   x   (..)   In = A::In = B::In            the two must agree on all four layouts, so that the
//   y   (..)   Out = A::Out = B::Out         layers around an Either compose with it whatever it
//                                            holds (checked at compile time)
//
// forward, backward (with the residual's gradient fused where the held layer takes it), the
// deferred weight pass of zero-bubble schedules, out_shape and the parameters are the held
// layer's; Ctx holds the held layer's. Names pass through (Either adds none: inside a Residual the
// held layer's own names, as the branch's). The walks over layers (nn/layer_walk.hpp's
// for_each_layer, nn/comm_walk.hpp's rows) go into the held layer; contains_layer asks of both,
// since what a collective about some leaves needs is the same answer on every rank of a type.
//
// defines: nn::Either
#pragma once

#include <concepts>
#include <string>
#include <utility>
#include <variant>

#include "weft/nn/sequential.hpp"

namespace weft::nn {

template <Layer A, Layer B>
class Either {
  static_assert(!std::same_as<A, B>, "Either: the two layers are of one type; use that type");
  static_assert(std::same_as<typename A::In, typename B::In> && std::same_as<typename A::Out, typename B::Out>,
                "Either: the two layers' input or output layouts differ; end each with the redistribution that "
                "brings it to the other's");
  static_assert(std::same_as<typename A::GradIn, typename B::GradIn> &&
                    std::same_as<typename A::GradOut, typename B::GradOut>,
                "Either: the two layers' gradient layouts differ");

 public:
  using In = typename A::In;
  using Out = typename A::Out;
  using GradIn = typename A::GradIn;
  using GradOut = typename A::GradOut;
  using Ctx = std::variant<typename A::Ctx, typename B::Ctx>;
  using first_type = A;
  using second_type = B;

  explicit Either(A a) : held_(std::in_place_index<0>, std::move(a)) {}
  explicit Either(B b) : held_(std::in_place_index<1>, std::move(b)) {}

  bool holds_first() const { return held_.index() == 0; }
  A* first() { return std::get_if<0>(&held_); }
  B* second() { return std::get_if<1>(&held_); }

  // f(layer) on the held layer.
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), held_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), held_);
  }

  template <Element T, class D, AxisComms M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh) {
    if (auto* a = first()) return detail::layer_forward(*a, ctx_of<0>(ctx), x, mesh);
    return detail::layer_forward(*second(), ctx_of<1>(ctx), x, mesh);
  }
  template <Element T, class D, AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh) {
    if (auto* a = first()) return detail::layer_backward(*a, std::get<0>(ctx), dy, mesh);
    return detail::layer_backward(*second(), std::get<1>(ctx), dy, mesh);
  }
  // The same, with dresid added (Residual's fused form): in the held layer's own pass where it
  // takes it, else afterwards.
  template <Element T, class D, AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh,
                                const Tensor<T, GradIn, D>& dresid) {
    if (auto* a = first()) return backward_adding(*a, std::get<0>(ctx), dy, mesh, dresid);
    return backward_adding(*second(), std::get<1>(ctx), dy, mesh, dresid);
  }

  void defer_weight(bool on) {
    visit([&](auto& l) { detail::set_defer_weight(l, on); });
  }
  void backward_weight(Ctx& ctx) {
    if (auto* a = first()) detail::run_backward_weight(*a, std::get<0>(ctx));
    else detail::run_backward_weight(*second(), std::get<1>(ctx));
  }

  Shape out_shape(const Shape& s) const {
    return visit([&](const auto& l) { return Shape(l.out_shape(s)); });
  }
  static std::string name() { return cat("Either<", A::name(), ", ", B::name(), ">"); }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    visit([&](auto& l) { l.for_each_param(prefix, f); });
  }

 private:
  std::variant<A, B> held_;

  // The held layer's context, made so where a micro-batch's last held the other's (never, for a
  // layer built as one of the two; kept where it is, so that its buffers are reused).
  template <std::size_t I>
  static auto& ctx_of(Ctx& ctx) {
    if (ctx.index() != I) ctx.template emplace<I>();
    return std::get<I>(ctx);
  }

  template <class L, Element T, class D, AxisComms M>
  static Tensor<T, GradIn, D> backward_adding(L& l, typename L::Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh,
                                              const Tensor<T, GradIn, D>& dresid) {
    if constexpr (requires { l.backward(ctx, dy, mesh, dresid); }) {
      return l.backward(ctx, dy, mesh, dresid);
    } else {
      auto dx = detail::layer_backward(l, ctx, dy, mesh);
      ops::Memory<D>::add(dx.dev(), dx.data(), dresid.data(), dx.numel());
      return dx;
    }
  }
};

}  // namespace weft::nn
