// nn::Layer: what Sequential, Residual and a model's blocks (nn::ModelSpec's Block) require of a layer.
//
//   In, Out          the layouts of its input and output (LayoutType)
//   GradIn, GradOut  the layouts of the gradient it returns (for its input) and takes (for its output)
//   Ctx              what forward keeps for backward, one per micro-batch (default-constructible)
//   out_shape(s)     its output's global shape for an input of global shape s
//   name()           what errors and describe() call it
//   for_each_param(prefix, f)   f(name, param) for each parameter, in a fixed order
//
// and, checked where they are called (their element type and device are the caller's):
//
//   forward(ctx, x[, mesh])     Tensor<T, In, D> -> Tensor<T, Out, D>
//   backward(ctx, dy[, mesh])   Tensor<T, GradOut, D> -> Tensor<T, GradIn, D>
//
// Optional: infer(x, mesh) (a forward that keeps nothing), defer_weight(on) and backward_weight(ctx)
// (zero-bubble schedules, detail::DefersWeight), comm_rows (describe's table). Each requirement is a
// concept of its own (layer_requires::), so that a layer missing one is refused where it is named, with
// the member in the message:
//
//   required for the satisfaction of 'out_shape<L>' [with L = MyLayer]
//   the required expression 'l.out_shape(s)' is invalid
#pragma once

#include <concepts>
#include <string>
#include <typeinfo>

#include "weft/core/error.hpp"
#include "weft/core/shape.hpp"
#include "weft/layout/layout.hpp"

namespace weft::nn {

namespace layer_requires {

// A visitor of any parameter type: for_each_param's f.
struct AnyParam {
  template <class P>
  void operator()(const std::string&, P&) const {}
};

template <class L>
concept layouts =
    requires {
      typename L::In;
      typename L::Out;
      typename L::GradIn;
      typename L::GradOut;
    } && LayoutType<typename L::In> && LayoutType<typename L::Out> && LayoutType<typename L::GradIn> &&
    LayoutType<typename L::GradOut>;

template <class L>
concept ctx = requires { typename L::Ctx; } && std::default_initializable<typename L::Ctx>;

template <class L>
concept out_shape = requires(const L& l, const Shape& s) {
  { l.out_shape(s) } -> std::convertible_to<Shape>;
};

template <class L>
concept name = requires(const L& l) {
  { l.name() } -> std::convertible_to<std::string>;
};

template <class L>
concept for_each_param = requires(L& l, const std::string& prefix, AnyParam f) { l.for_each_param(prefix, f); };

}  // namespace layer_requires

template <class L>
concept Layer = layer_requires::layouts<L> && layer_requires::ctx<L> && layer_requires::out_shape<L> &&
                layer_requires::name<L> && layer_requires::for_each_param<L>;

// f(), with a weft::Error it throws placed under the named part part() (Error::within), so that an
// error raised deep in a model names the layer's path ("h1.mlp.fc", as its parameters are named).
// Errors of derived types (another rank's failure, threads::FailedElsewhere) and other exceptions
// pass unchanged. part is called only on an error.
template <class F, class Part>
decltype(auto) within(Part&& part, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (typeid(e) != typeid(Error)) throw;
    throw e.within(part());
  }
}

}  // namespace weft::nn
