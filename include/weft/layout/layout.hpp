// Layout<DataP, TensorP, PipeP = StageLocal, ContextP = Replicate, ExpertP = Replicate>: how a tensor
// is spread over the mesh's axes, one placement per axis. The algebra below is generic over the axis
// list (kAxes: data, pipe, context, tensor, in mesh order, then expert). A tensor inside a pipeline stage belongs to
// that stage (StageLocal on pipe), and a tensor that context parallelism does not split is whole on every context rank
// (Replicate on context), which the defaults spell: Layout<Shard<0>, Shard<1>> means what it always
// meant.
//
// The context axis (context parallelism, docs/context.md) shards activations over the sequence:
// Shard<1> on context for a (B, T, C) activation. Its ranks hold the sequence in the load-balanced
// order of context::Chunks (rank r the chunks r and 2c - 1 - r of 2c), so the global tensor that
// the layout describes is the sequence in that order, and Shard<1> of it is each rank's pair of
// chunks, contiguous. Parameters are Replicate on context; their gradients are reduced over the
// data and context ranks together (Mesh::data_context), by the data-parallel protocol.
//
// Requires: every argument is a placement, and no two axes shard the same dim, with one exception:
// the context and tensor axes may both shard one dim, nested, the context axis outer. That is
// sequence parallelism inside context parallelism: a context rank's rows (T / c) are split again
// into tp contiguous slices over its tensor group, local (B/dp, T/(c tp), C) (local_shape,
// local_box). Other nestings would make the shard order part of the layout; weft keeps layouts
// per-axis independent instead, which is what makes each redistribution a product of one
// collective per axis. A redistribution may change the tensor placement of a nested layout (the
// collective then runs on a context rank's rows alone, which its local buffer is: the layers'
// GatherFromSequenceRows and ScatterToSequenceRows) but not its context placement (Transition
// refuses that at compile time: the steps would interleave the wrong slices). Negative and positive
// spellings of one dim are compared at run time (local_shape), where the rank is known.
//
// The expert axis (expert parallelism, docs/moe.md) is not a fifth factor of the world: its groups
// are carved from each data x context group (Mesh::comm(Axis::expert), Megatron's expert-model-
// parallel group), so a rank's expert index follows from its data and context indices. Only the
// experts' weights are placed on it: Shard<0> on expert over their (E, ...) dim, Replicate on data
// and context, whose ranks of one expert index (Mesh::expert_data) hold the same experts.
//
// Example, a (B, T, C) activation under Megatron sequence parallelism on a data x tensor mesh:
//   Layout<Shard<0>, Shard<1>>  // batch split over data, sequence over tensor: local (B/dp, T/tp, C)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/core/shape.hpp"
#include "weft/layout/placement.hpp"

namespace weft {

enum class Axis : std::uint8_t { data, pipe, context, tensor, expert };

// The axes whose degrees multiply to the world, in mesh order, slowest first: the world rank is
// ((data_index * pipe + pipe_index) * context + context_index) * tensor + tensor_index, so a tensor
// group is the fastest (neighbouring ranks, as in Megatron's tp-cp-dp-pp order), then context.
inline constexpr std::array<Axis, 4> kWorldAxes{Axis::data, Axis::pipe, Axis::context, Axis::tensor};
// Every axis a layout places a tensor on: the world's, then expert (carved from data x context).
inline constexpr std::array<Axis, 5> kAxes{Axis::data, Axis::pipe, Axis::context, Axis::tensor, Axis::expert};

constexpr const char* name(Axis a) {
  switch (a) {
    case Axis::data: return "data";
    case Axis::pipe: return "pipe";
    case Axis::context: return "context";
    case Axis::tensor: return "tensor";
    case Axis::expert: return "expert";
  }
  return "?";
}

// The run-time side of a layout: the degree of each axis and this rank's index on it.
struct Spread {
  int data_degree = 1, tensor_degree = 1;
  int data_index = 0, tensor_index = 0;
  int pipe_degree = 1, pipe_index = 0;
  int context_degree = 1, context_index = 0;
  int expert_degree = 1, expert_index = 0;  // (data x context index) mod expert degree

  constexpr int degree(Axis a) const {
    return a == Axis::data      ? data_degree
           : a == Axis::pipe    ? pipe_degree
           : a == Axis::context ? context_degree
           : a == Axis::expert  ? expert_degree
                                : tensor_degree;
  }
  constexpr int index(Axis a) const {
    return a == Axis::data      ? data_index
           : a == Axis::pipe    ? pipe_index
           : a == Axis::context ? context_index
           : a == Axis::expert  ? expert_index
                                : tensor_index;
  }
};

namespace detail {
template <class A, class B>
inline constexpr bool same_shard_dim = IsShard<A> && IsShard<B> && requires { requires A::dim == B::dim; };
}  // namespace detail

template <class DataP, class TensorP, class PipeP = StageLocal, class ContextP = Replicate, class ExpertP = Replicate>
struct Layout {
  static_assert(Placement<DataP>,
                "Layout: the data-axis placement is not a placement; use Replicate, Shard<d> or Partial");
  static_assert(Placement<TensorP>,
                "Layout: the tensor-axis placement is not a placement; use Replicate, Shard<d> or Partial");
  static_assert(Placement<PipeP>,
                "Layout: the pipe-axis placement is not a placement; use Replicate, Shard<d> or Partial");
  static_assert(Placement<ContextP> && !IsStageLocal<ContextP>,
                "Layout: the context-axis placement is not a placement; use Replicate, Shard<d> or Partial");
  static_assert(!detail::same_shard_dim<DataP, TensorP>,
                "Layout: the data and tensor axes shard the same dim; shard different dims (nested "
                "sharding of one dim is not a weft layout)");
  static_assert(!detail::same_shard_dim<DataP, PipeP> && !detail::same_shard_dim<PipeP, TensorP>,
                "Layout: the pipe axis shards the same dim as another axis; shard different dims (nested "
                "sharding of one dim is not a weft layout)");
  static_assert(!detail::same_shard_dim<ContextP, DataP> && !detail::same_shard_dim<ContextP, PipeP>,
                "Layout: the context axis shards the same dim as the data or pipe axis; shard different dims "
                "(only the tensor axis may shard a context-sharded dim again, inside each context rank's rows)");
  static_assert((IsReplicate<ExpertP> || IsShard<ExpertP>) &&
                    (IsReplicate<ExpertP> || (!IsShard<DataP> && !IsShard<ContextP>)),
                "Layout: the expert-axis placement must be Replicate, or Shard<d> of a tensor that the data and "
                "context axes do not shard (the expert groups are carved from the data x context ranks)");
  static_assert(!detail::same_shard_dim<ExpertP, TensorP> && !detail::same_shard_dim<ExpertP, PipeP>,
                "Layout: the expert axis shards the same dim as another axis; shard different dims");

  using data = DataP;
  using tensor = TensorP;
  using pipe = PipeP;
  using context = ContextP;
  using expert = ExpertP;

  // The placement on axis A.
  template <Axis A>
  using on = std::conditional_t<
      A == Axis::data, DataP,
      std::conditional_t<
          A == Axis::pipe, PipeP,
          std::conditional_t<A == Axis::context, ContextP, std::conditional_t<A == Axis::expert, ExpertP, TensorP>>>>;

  // As written, defaults left out: "Layout<Shard<0>, Replicate>", "Layout<Shard<0>, Replicate,
  // StageLocal, Shard<1>>", "Layout<Replicate, Replicate, StageLocal, Replicate, Shard<0>>".
  static std::string name() {
    const bool expert = !IsReplicate<ExpertP>;
    const bool context = expert || !IsReplicate<ContextP>;
    return cat("Layout<", DataP::name(), ", ", TensorP::name(),
               IsStageLocal<PipeP> && !context ? std::string() : cat(", ", PipeP::name()),
               context ? cat(", ", ContextP::name()) : std::string(),
               expert ? cat(", ", ExpertP::name()) : std::string(), ">");
  }
};

namespace detail {
template <class T> inline constexpr bool is_layout = false;
template <class D, class T, class P, class C, class E> inline constexpr bool is_layout<Layout<D, T, P, C, E>> = true;
}  // namespace detail

template <class L>
concept LayoutType = detail::is_layout<L>;

// The placement of layout L on axis A.
template <LayoutType L, Axis A>
using placement_on = typename L::template on<A>;

// Calls f(std::integral_constant<Axis, A>{}) for every axis A of kAxes, in mesh order.
template <class F>
constexpr void for_each_axis(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(std::integral_constant<Axis, kAxes[I]>{}), ...);
  }(std::make_index_sequence<kAxes.size()>{});
}

// Common layouts.
using Replicated = Layout<Replicate, Replicate>;
template <int D> using TensorSharded = Layout<Replicate, Shard<D>>;
template <int D> using DataSharded = Layout<Shard<D>, Replicate>;
using TensorPartial = Layout<Replicate, Partial>;
// An expert parameter (E, ...): its experts sharded over the expert axis, TensorP on tensor.
template <class TensorP = Replicate>
using ExpertSharded = Layout<Replicate, TensorP, StageLocal, Replicate, Shard<0>>;

// The layout of a gradient: dual placement on each axis but expert, whose placement stays (it never
// holds a pending sum: what an expert group's ranks add up lies in their data and context placements).
template <LayoutType L>
using dual_layout =
    Layout<dual_placement_t<typename L::data>, dual_placement_t<typename L::tensor>, dual_placement_t<typename L::pipe>,
           dual_placement_t<typename L::context>, typename L::expert>;

// Compile-time queries.
template <LayoutType L, Axis A> inline constexpr bool is_sharded_on = IsShard<placement_on<L, A>>;
template <LayoutType L, Axis A> inline constexpr bool is_partial_on = IsPartial<placement_on<L, A>>;
template <LayoutType L, Axis A> inline constexpr bool is_replicated_on = IsReplicate<placement_on<L, A>>;
template <LayoutType L>
inline constexpr bool has_partial = IsPartial<typename L::data> || IsPartial<typename L::pipe> ||
                                    IsPartial<typename L::context> || IsPartial<typename L::tensor>;

// The dim that placement P shards in a tensor of `global` shape, or -1 when P does not shard.
template <Placement P>
constexpr int sharded_dim(const Shape& global) {
  if constexpr (IsShard<P>) return global.normalize_dim(P::dim);
  else return -1;
}

// Local shape of a tensor of `global` shape under layout L on the degrees in `s`.
// Requires: every sharded extent divisible by its axis degree (a dim that context and tensor both
// shard: by their product), and no two axes shard the same dim but context then tensor.
// Guarantees: the local shards of all ranks tile the global tensor exactly once.
// Example: local_shape<Layout<Shard<0>, Shard<-1>>>({8, 6}, {.data_degree = 2, .tensor_degree = 3})
//          == (4, 2); local_shape<Layout<Shard<0>, Shard<1>, StageLocal, Shard<1>>>({2, 16, 4},
//          {.context_degree = 2, .tensor_degree = 2}) == (2, 4, 4).
template <LayoutType L>
constexpr Shape local_shape(const Shape& global, const Spread& s) {
  Shape local = global;
  std::array<int, kAxes.size()> dims{};
  std::size_t k = 0;
  for_each_axis([&](auto a) {
    constexpr Axis A = decltype(a)::value;
    const int d = sharded_dim<placement_on<L, A>>(global);
    for (std::size_t j = 0; j < k; ++j)
      if (d >= 0 && dims[j] == d && !(kAxes[j] == Axis::context && A == Axis::tensor))
        throw Error(
            L::name(),
            cat("the ", name(kAxes[j]), " and ", name(A), " axes both shard dim ", d, " of a tensor of shape ", global),
            "shard different dims");
    dims[k++] = d;
    if (d < 0) return;
    const int degree = s.degree(A);
    if (degree <= 0 || local[d] % degree != 0)
      throw Error(L::name(),
                  cat("dim ", d, " of shape ", global, " has extent ", local[d],
                      local[d] == global[d] ? std::string() : cat(" on each ", name(Axis::context), " rank"),
                      ", not divisible by the ", name(A), " degree ", degree),
                  "choose a degree that divides the extent, or pad the tensor");
    local[d] /= degree;
  });
  return local;
}

// The box of the global tensor that a rank holds under L: the global index of its first element in
// each dim, and its extent there (the local shape). Replicate and Partial axes do not move the box
// (under Partial the rank holds an addend of the whole box). Requires what local_shape requires.
// Guarantees: without Partial, the boxes of all ranks that differ on a sharded axis are disjoint
// and together cover the global tensor (checkpoint resharding intersects them).
// Example: local_box<Layout<Shard<0>, Shard<-1>>>({8, 6}, {.data_degree = 2, .tensor_degree = 3,
//          .data_index = 1, .tensor_index = 2}) == {.offset = (4, 4), .extent = (4, 2)}.
struct Box {
  Shape offset, extent;
};

template <LayoutType L>
constexpr Box local_box(const Shape& global, const Spread& s) {
  Box b{global, local_shape<L>(global, s)};
  Shape block = global;  // the extent of the box an axis splits: a nested dim's outer shard
  for (int d = 0; d < global.rank(); ++d) b.offset[d] = 0;
  for_each_axis([&](auto a) {
    constexpr Axis A = decltype(a)::value;
    const int d = sharded_dim<placement_on<L, A>>(global);
    if (d < 0) return;
    block[d] /= s.degree(A);
    b.offset[d] += s.index(A) * block[d];
  });
  return b;
}

}  // namespace weft
