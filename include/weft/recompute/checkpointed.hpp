// recompute::apply_t<Policy, Layer>: a layer (a transformer block, or any layer of the protocol in
// nn/sequential.hpp) under a recompute policy, written once for every block.
//
//   None       the layer as it is
//   Selective  the layer as it is: its layers decide what they rebuild cheaply (CausalSelfAttention
//              under Selective keeps qkv and recomputes the probabilities in backward)
//   Full       Checkpointed<Layer>: forward runs the layer into a scratch context and keeps only
//              its input; backward re-runs the layer's forward (its collectives too) into a fresh
//              context, then its backward. A zero-bubble schedule's deferred weight pass uses the
//              context that backward rebuilt.
//
// The layer names its element type and device (value_type, device) and its input layout (In), and
// has forward(ctx, x, mesh), backward(ctx, dy, mesh) and infer(x, mesh). Gradients are bitwise
// those of None: the recomputation runs the same code on the same input.
#pragma once

#include <concepts>
#include <type_traits>
#include <utility>

#include "weft/device/allocation.hpp"
#include "weft/recompute/policies.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::recompute {

template <class L>
class Checkpointed : public L {
  using T = typename L::value_type;
  using D = typename L::device;
  using X = Tensor<T, typename L::In, D>;

 public:
  using L::L;
  explicit Checkpointed(L l) : L(std::move(l)) {}

  struct Ctx {
    X x;                    // the input, the only tensor kept between forward and backward
    typename L::Ctx inner;  // empty until backward rebuilds it
  };

  template <class M>
  auto forward(Ctx& ctx, const X& x, M& mesh) {
    typename L::Ctx scratch;  // freed when forward returns, after the input's copy is made
    auto y = L::forward(scratch, x, mesh);
    ctx = Ctx{};
    ctx.x = x.clone(Category::activations);
    return y;
  }

  template <class M, class DY>
  auto backward(Ctx& ctx, const DY& dy, M& mesh) {
    {
      X x = std::move(ctx.x);  // freed before the backward: the rebuilt context holds its own copies
      L::forward(ctx.inner, x, mesh);  // the forward again, its output dropped (inner is empty: forward kept only x)
    }
    return L::backward(ctx.inner, dy, mesh);
  }

  // Zero-bubble schedules: the weight pass over the context backward rebuilt.
  void backward_weight(Ctx& ctx) {
    L::backward_weight(ctx.inner);
    ctx = Ctx{};
  }
};

template <Policy R, class L>
using apply_t = std::conditional_t<std::same_as<R, Full>, Checkpointed<L>, L>;

}  // namespace weft::recompute
