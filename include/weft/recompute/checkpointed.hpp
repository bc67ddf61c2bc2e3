// recompute::apply_t<Policy, Layer>: a layer (a transformer block, or any layer of the protocol in
// nn/sequential.hpp) under a recompute policy, written once for every block.
//
//   None       the layer as it is
//   Selective  the layer as it is: its layers decide what they rebuild cheaply (GroupedQueryAttention
//              under Selective keeps qkv and recomputes the probabilities in backward)
//   Full       Checkpointed<Layer>: forward runs the layer into a scratch context and keeps only
//              its input; backward re-runs the layer's forward (its collectives too) into a fresh
//              context, then its backward. A zero-bubble schedule's deferred weight pass uses the
//              context that backward rebuilt.
//
// The layer names its element type and device (value_type, device; or give them: Checkpointed<L, T, D>,
// apply_t<Policy, L, T, D>, for a layer that names none, as a Sequential) and its input layout (In),
// and has forward(ctx, x, mesh) and backward(ctx, dy, mesh). Gradients are bitwise
// those of None: the recomputation runs the same code on the same input.
#pragma once

#include <concepts>
#include <type_traits>
#include <utility>

#include "weft/device/allocation.hpp"
#include "weft/recompute/policies.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::recompute {

template <class L, class T = typename L::value_type, class D = typename L::device>
class Checkpointed : public L {
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
      X x = std::move(ctx.x);          // freed before the backward: the rebuilt context holds its own copies
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

namespace detail {
template <Policy R, class L, class T, class D> struct apply {
  using type = L;
};
template <class L, class T, class D> struct apply<Full, L, T, D> {
  using type = Checkpointed<L, T, D>;
};
template <class L> struct value_of {
  using type = typename L::value_type;
};
template <class L> struct device_of {
  using type = typename L::device;
};
}  // namespace detail

template <Policy R, class L, class T = typename detail::value_of<L>::type,
          class D = typename detail::device_of<L>::type>
using apply_t = typename detail::apply<R, L, T, D>::type;

}  // namespace weft::recompute
