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
#include <vector>

#include "weft/layout/redistribute.hpp"
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

using CopyToTensor = Redistribute<act::Replicated, act::Replicated, act::Partial, act::Replicated>;
using ReduceFromTensor = Redistribute<act::Partial, act::Replicated, act::Replicated, act::Replicated>;
using GatherFromSequence = Redistribute<act::Sequence, act::Replicated, act::Partial, act::Sequence>;
using ScatterToSequence = Redistribute<act::Partial, act::Sequence, act::Sequence, act::Replicated>;

// Replicated parameters whose gradient is, under sequence parallelism, a partial sum over each
// tensor rank's slice of the sequence (LayerNorm weights, position embeddings). Gradients
// accumulate over micro-batches, so only this backward's increment is reduced:
//   before = snapshot_grads(ps);  ...backward...;  reduce_grad_increment(ps, before, mesh);
// leaves grad = before + (sum over tensor ranks of the increment), in one all-reduce for all of ps.
// ps: a range of Param<T, Replicated>* (a std::array, say).
template <Floating T, class Params>
std::vector<T> snapshot_grads(const Params& ps) {
  std::vector<T> g;
  for (auto* p : ps) g.insert(g.end(), p->grad.data(), p->grad.data() + p->grad.numel());
  return g;
}

template <Floating T, class Params, AxisComms M>
void reduce_grad_increment(const Params& ps, const std::vector<T>& before, M& mesh) {
  std::vector<T> delta = snapshot_grads<T>(ps);
  for (std::size_t i = 0; i < delta.size(); ++i) delta[i] -= before[i];
  mesh.comm(Axis::tensor).all_reduce(std::span<T>(delta));
  std::size_t at = 0;
  for (auto* p : ps)
    for (std::int64_t i = 0; i < p->grad.numel(); ++i, ++at) p->grad[i] = before[at] + delta[at];
}

}  // namespace weft::nn
