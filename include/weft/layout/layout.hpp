// Layout<DataPlacement, TensorPlacement>: how a tensor is spread over the mesh axes that carry
// tensors (data and tensor; a pipeline stage owns whole layers, so no tensor is spread over pipe).
//
// Requires: both arguments are placements, and the two axes do not shard the same dim. Nested
// sharding of one dim over two axes would make the shard order (which axis is outer) part of the
// layout; weft keeps layouts per-axis independent instead, which is what makes each redistribution
// a product of one collective per axis. Negative and positive spellings of one dim are compared at
// run time (local_shape), where the rank is known.
//
// Example, a (B, T, C) activation under Megatron sequence parallelism on a data x tensor mesh:
//   Layout<Shard<0>, Shard<1>>  // batch split over data, sequence over tensor: local (B/dp, T/tp, C)
#pragma once

#include <cstdint>
#include <string>

#include "weft/core/error.hpp"
#include "weft/core/shape.hpp"
#include "weft/layout/placement.hpp"

namespace weft {

enum class Axis : std::uint8_t { data, tensor };

constexpr const char* name(Axis a) { return a == Axis::data ? "data" : "tensor"; }

// The run-time side of a layout: the degree of each axis and this rank's index on it.
struct Spread {
  int data_degree = 1, tensor_degree = 1;
  int data_index = 0, tensor_index = 0;

  constexpr int degree(Axis a) const { return a == Axis::data ? data_degree : tensor_degree; }
  constexpr int index(Axis a) const { return a == Axis::data ? data_index : tensor_index; }
};

template <class DataP, class TensorP>
struct Layout {
  static_assert(Placement<DataP>,
                "Layout: the data-axis placement is not a placement; use Replicate, Shard<d> or Partial");
  static_assert(Placement<TensorP>,
                "Layout: the tensor-axis placement is not a placement; use Replicate, Shard<d> or Partial");
  static_assert(!(IsShard<DataP> && IsShard<TensorP> && requires { requires DataP::dim == TensorP::dim; }),
                "Layout: the data and tensor axes shard the same dim; shard different dims (nested "
                "sharding of one dim is not a weft layout)");

  using data = DataP;
  using tensor = TensorP;

  static std::string name() { return cat("Layout<", DataP::name(), ", ", TensorP::name(), ">"); }
};

namespace detail {
template <class T> inline constexpr bool is_layout = false;
template <class D, class T> inline constexpr bool is_layout<Layout<D, T>> = true;
}  // namespace detail

template <class L> concept LayoutType = detail::is_layout<L>;

// The placement of layout L on axis A.
template <LayoutType L, Axis A>
using placement_on = std::conditional_t<A == Axis::data, typename L::data, typename L::tensor>;

// Common layouts.
using Replicated = Layout<Replicate, Replicate>;
template <int D> using TensorSharded = Layout<Replicate, Shard<D>>;
template <int D> using DataSharded = Layout<Shard<D>, Replicate>;
using TensorPartial = Layout<Replicate, Partial>;

// The layout of a gradient: dual placement on each axis.
template <LayoutType L>
using dual_layout = Layout<dual_placement_t<typename L::data>, dual_placement_t<typename L::tensor>>;

// Compile-time queries.
template <LayoutType L, Axis A> inline constexpr bool is_sharded_on = IsShard<placement_on<L, A>>;
template <LayoutType L, Axis A> inline constexpr bool is_partial_on = IsPartial<placement_on<L, A>>;
template <LayoutType L, Axis A> inline constexpr bool is_replicated_on = IsReplicate<placement_on<L, A>>;

// The dim that placement P shards in a tensor of `global` shape, or -1 when P does not shard.
template <Placement P>
constexpr int sharded_dim(const Shape& global) {
  if constexpr (IsShard<P>) return global.normalize_dim(P::dim);
  else return -1;
}

// Local shape of a tensor of `global` shape under layout L on the degrees in `s`.
// Requires: every sharded extent divisible by its axis degree, and the two axes shard different
// dims. Guarantees: the local shards of all ranks tile the global tensor exactly once.
// Example: local_shape<Layout<Shard<0>, Shard<-1>>>({8, 6}, {.data_degree = 2, .tensor_degree = 3})
//          == (4, 2).
template <LayoutType L>
constexpr Shape local_shape(const Shape& global, const Spread& s) {
  Shape local = global;
  const int dd = sharded_dim<typename L::data>(global);
  const int td = sharded_dim<typename L::tensor>(global);
  if (dd >= 0 && dd == td)
    throw Error(L::name(), cat("data and tensor axes both shard dim ", dd, " of a tensor of shape ", global),
                "shard different dims");
  auto split = [&](int d, int degree, Axis a) {
    if (d < 0) return;
    if (degree <= 0 || global[d] % degree != 0)
      throw Error(L::name(),
                  cat("dim ", d, " of shape ", global, " has extent ", global[d], ", not divisible by the ",
                      name(a), " degree ", degree),
                  "choose a degree that divides the extent, or pad the tensor");
    local[d] = global[d] / degree;
  };
  split(dd, s.data_degree, Axis::data);
  split(td, s.tensor_degree, Axis::tensor);
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
  for (int d = 0; d < global.rank(); ++d) b.offset[d] = 0;
  const int dd = sharded_dim<typename L::data>(global), td = sharded_dim<typename L::tensor>(global);
  if (dd >= 0) b.offset[dd] = s.data_index * b.extent[dd];
  if (td >= 0) b.offset[td] = s.tensor_index * b.extent[td];
  return b;
}

}  // namespace weft
