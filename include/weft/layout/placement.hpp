// Placements: how one mesh axis holds a tensor.
//
//   Replicate   every rank of the axis holds the whole tensor.
//   Shard<d>    rank i of n holds the i-th of n equal slices along dim d (negative d counts from
//               the last dim, as in PyTorch); the tensor is their concatenation.
//   Partial     every rank holds a full-size addend; the tensor is their sum (a pending reduction).
//   StageLocal  (pipe axis) the tensor belongs to one pipeline stage and lives on that stage's ranks
//               only; it is not spread over the axis, and no redistribution crosses it (activations
//               move between stages by send/recv in the pipeline executor).
//
// Placements are empty tag types: they take no storage and exist to steer overload resolution and
// static_asserts. This header is plain C++20 (no CUDA, MPI, NCCL or Eigen).
#pragma once

#include <concepts>
#include <string>
#include <type_traits>

#include "weft/core/error.hpp"

namespace weft {

struct Replicate {
  static std::string name() { return "Replicate"; }
};

template <int Dim>
struct Shard {
  static constexpr int dim = Dim;
  static std::string name() { return cat("Shard<", Dim, ">"); }
};

struct Partial {
  static std::string name() { return "Partial"; }
};

struct StageLocal {
  static std::string name() { return "StageLocal"; }
};

namespace detail {
template <class T> inline constexpr bool is_shard = false;
template <int D> inline constexpr bool is_shard<Shard<D>> = true;
}  // namespace detail

template <class P>
concept IsReplicate = std::same_as<P, Replicate>;
template <class P>
concept IsPartial = std::same_as<P, Partial>;
template <class P>
concept IsShard = detail::is_shard<P>;
template <class P>
concept IsStageLocal = std::same_as<P, StageLocal>;
template <class P>
concept Placement = IsReplicate<P> || IsPartial<P> || IsShard<P> || IsStageLocal<P>;

// The placement of a gradient, paired with its forward placement so that the sum over ranks of
// <local value, local gradient> is the global inner product (see docs/layouts.md, "Adjoints"):
//   dual(Replicate) = Partial, dual(Partial) = Replicate, dual(Shard<d>) = Shard<d>,
//   dual(StageLocal) = StageLocal.
template <Placement P> struct dual_placement {
  using type = P;
};
template <> struct dual_placement<Replicate> {
  using type = Partial;
};
template <> struct dual_placement<Partial> {
  using type = Replicate;
};
template <Placement P> using dual_placement_t = typename dual_placement<P>::type;

}  // namespace weft
