// The parallel roles of layers, and the layouts of activations between them.
//
// Activations are (B, T, C): batch split over the data axis (Shard<0>); on the tensor axis they are
// Replicate, Partial (a row-parallel output before its reduction), sharded over features
// (Shard<-1>, a column-parallel output) or over the sequence (Shard<1>, Megatron sequence
// parallelism).
//
// Gradients follow Megatron's convention: the gradient of a Replicate activation is Replicate (each
// tensor rank holds the full gradient, computed redundantly), that of a Partial activation is
// Replicate, and that of a sharded activation is sharded the same way. Each communication pair is
// then one forward/backward pair (comm.hpp).
#pragma once

#include "weft/layout/layout.hpp"

namespace weft::nn {

// Roles of a Linear layer on the tensor axis.
struct ColumnParallel {};  // weight split over output features: in Replicate, out Shard<-1>
struct RowParallel {};     // weight split over input features: in Shard<-1>, out Partial
struct NoParallel {};      // weight replicated: in and out Replicate

template <class R>
concept LinearRole = std::same_as<R, ColumnParallel> || std::same_as<R, RowParallel> || std::same_as<R, NoParallel>;

namespace act {
using Full = Layout<Shard<0>, Replicate>;         // (B/dp, T, C): the whole sequence and features on every tensor rank
using Features = Layout<Shard<0>, Shard<-1>>;     // (B/dp, T, C/tp)
using Partial = Layout<Shard<0>, weft::Partial>;  // (B/dp, T, C), summed over tensor ranks
using Sequence = Layout<Shard<0>, Shard<1>>;      // (B/dp, T/tp, C)
// Context parallelism: a context rank's rows of the sequence (B/dp, T/c, C), docs/context.md.
using Rows = Layout<Shard<0>, Replicate, StageLocal, Shard<1>>;
using RowsPartial = Layout<Shard<0>, weft::Partial, StageLocal, Shard<1>>;
// Both: sequence parallelism inside context parallelism, a context rank's rows split again over its
// tensor group (B/dp, T/(c tp), C), the context axis outer (layout.hpp).
using RowsSequence = Layout<Shard<0>, Shard<1>, StageLocal, Shard<1>>;
}  // namespace act

// The gradient layout of a parameter that is Replicate over the tensor axis and applied to
// activations in layout A: Partial there when A shards the sequence over the tensor axis (each rank
// sums over its own positions), Replicate otherwise (every rank computes the same full sum).
template <LayoutType A>
using replicated_param_grad =
    std::conditional_t<IsShard<typename A::tensor>, Layout<Replicate, weft::Partial>, Replicated>;
// The same for a parameter whose experts are sharded over the expert axis (ExpertSharded<>): each
// expert's gradient is whole on the rank that holds it, Partial over tensor under SP.
template <LayoutType A>
using expert_param_grad =
    std::conditional_t<IsShard<typename A::tensor>, ExpertSharded<weft::Partial>, ExpertSharded<>>;

// Epilogues fused into a Linear's forward.
namespace epilogue {
struct None {};
struct Gelu {};  // y = gelu(x W^T + b)
}  // namespace epilogue

// The four layouts of a layer that keeps its input's layout (a norm, an elementwise op): derive
// from SameLayout<A>.
template <LayoutType A>
struct SameLayout {
  using In = A;
  using Out = A;
  using GradIn = A;
  using GradOut = A;
};

}  // namespace weft::nn
