// Communication between layers: each forward/backward pair is one type.
//
// Redistribute<From, To, GradTo, GradFrom>: forward redistributes an activation From -> To; backward
// redistributes its gradient GradTo -> GradFrom. Megatron's four pairs are instances:
//
//   pair                 forward (tensor axis)            backward
//   CopyToTensor         Replicate -> Replicate (none)    Partial -> Replicate (all-reduce)
//   ReduceFromTensor     Partial -> Replicate (all-red.)  Replicate -> Replicate (none)
//   GatherFromSequence   Shard<1> -> Replicate (gather)   Partial -> Shard<1> (reduce-scatter)
//   ScatterToSequence    Partial -> Shard<1> (red.-sc.)   Shard<1> -> Replicate (all-gather)
//
// (Megatron's gather_output / input_is_parallel flags are what these types replace.)
#pragma once

#include <string>

#include "weft/comm/redistribute.hpp"
#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"

namespace weft::nn {

template <LayoutType From, LayoutType To, LayoutType GradTo, LayoutType GradFrom>
struct Redistribute {
  using In = From;
  using Out = To;
  using GradOut = GradTo;
  using GradIn = GradFrom;

  template <Element T, class D, AxisComms M>
  static Tensor<T, To, D> forward(const Tensor<T, From, D>& x, M& mesh) {
    return redistribute<To>(x, mesh);
  }
  template <Element T, class D, AxisComms M>
  static Tensor<T, GradFrom, D> backward(const Tensor<T, GradTo, D>& dy, M& mesh) {
    return redistribute<GradFrom>(dy, mesh);
  }

  // As a layer of a Sequential: nothing to save, no parameters, the shape unchanged.
  struct Ctx {};
  template <Element T, class D, AxisComms M>
  Tensor<T, To, D> forward(Ctx&, const Tensor<T, From, D>& x, M& mesh) {
    return forward(x, mesh);
  }
  template <Element T, class D, AxisComms M>
  Tensor<T, GradFrom, D> backward(Ctx&, const Tensor<T, GradTo, D>& dy, M& mesh) {
    return backward(dy, mesh);
  }
  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return cat("Redistribute<", From::name(), " -> ", To::name(), ">"); }
  template <class F>
  void for_each_param(const std::string&, F&&) {}
};

using CopyToTensor = Redistribute<act::Full, act::Full, act::Partial, act::Full>;
using ReduceFromTensor = Redistribute<act::Partial, act::Full, act::Full, act::Full>;
using GatherFromSequence = Redistribute<act::Sequence, act::Full, act::Partial, act::Sequence>;
using ScatterToSequence = Redistribute<act::Partial, act::Sequence, act::Sequence, act::Full>;
// The four on a context rank's rows (context parallelism): the same tensor-axis collectives, over
// the rows alone (with sequence parallelism, the rank's rows split over its tensor group).
using CopyToTensorRows = Redistribute<act::Rows, act::Rows, act::RowsPartial, act::Rows>;
using ReduceFromTensorRows = Redistribute<act::RowsPartial, act::Rows, act::Rows, act::Rows>;
using GatherFromSequenceRows = Redistribute<act::RowsSequence, act::Rows, act::RowsPartial, act::RowsSequence>;
using ScatterToSequenceRows = Redistribute<act::RowsPartial, act::RowsSequence, act::RowsSequence, act::Rows>;

}  // namespace weft::nn
