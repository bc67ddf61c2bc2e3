// Which collective turns one layout into another, decided at compile time, and the plan of a
// redistribution (collective, axis, bytes) for given shapes and degrees.
//
// Per mesh axis, From -> To picks one step (DESIGN.md's table):
//
//   from \ to   Replicate     Shard<b>                       Partial
//   Replicate   none          slice (local)                  keep_one (rank 0 keeps, others zero)
//   Shard<a>    all_gather    none (a == b) / all_to_all     not a redistribution (see below)
//   Partial     all_reduce    reduce_scatter                 none
//
// Shard -> Partial would zero-pad each shard to the full size; weft performs it only as `embed`, the
// adjoint of `slice` (a gradient step), never as a forward redistribution.
//
// A two-axis redistribution is one step per axis. Steps that shrink the local buffer (slice,
// reduce_scatter) run first, so the growing ones (all_gather) move fewer bytes, unless that order
// passes through a layout that shards one dim on both axes; when both orders do, the transition is
// refused at compile time (go through an intermediate layout).
//
// This header is plain C++20 (no CUDA, MPI, NCCL or Eigen).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>

#include "weft/layout/layout.hpp"

namespace weft {

enum class Collective : std::uint8_t {
  none,            // nothing moves
  slice,           // Replicate -> Shard: keep the local slice
  keep_one,        // Replicate -> Partial: rank 0 keeps its copy, the others hold zeros
  embed,           // Shard -> Partial (adjoint of slice only): zero-pad the shard to full size
  all_gather,      // Shard -> Replicate
  all_to_all,      // Shard<a> -> Shard<b>
  all_reduce,      // Partial -> Replicate
  reduce_scatter,  // Partial -> Shard
};

constexpr const char* name(Collective c) {
  switch (c) {
    case Collective::none: return "none";
    case Collective::slice: return "slice";
    case Collective::keep_one: return "keep_one";
    case Collective::embed: return "embed";
    case Collective::all_gather: return "all_gather";
    case Collective::all_to_all: return "all_to_all";
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, Collective c) { return os << name(c); }

// True when the step moves data between ranks.
constexpr bool communicates(Collective c) {
  return c == Collective::all_gather || c == Collective::all_to_all || c == Collective::all_reduce ||
         c == Collective::reduce_scatter;
}

// The step on one axis from placement From to placement To (embed included: it is the adjoint of
// slice). The dims of the step are the From shard dim and the To shard dim, or kNoDim.
inline constexpr int kNoDim = 1 << 20;

template <Placement From, Placement To>
constexpr Collective axis_step() {
  if constexpr (IsReplicate<From>) {
    if constexpr (IsReplicate<To>) return Collective::none;
    else if constexpr (IsShard<To>) return Collective::slice;
    else return Collective::keep_one;
  } else if constexpr (IsShard<From>) {
    if constexpr (IsReplicate<To>) return Collective::all_gather;
    else if constexpr (IsShard<To>) return From::dim == To::dim ? Collective::none : Collective::all_to_all;
    else return Collective::embed;
  } else {
    if constexpr (IsReplicate<To>) return Collective::all_reduce;
    else if constexpr (IsShard<To>) return Collective::reduce_scatter;
    else return Collective::none;
  }
}

template <Placement P>
constexpr int shard_dim_or_none() {
  if constexpr (IsShard<P>) return P::dim;
  else return kNoDim;
}

// One step of a redistribution, at the type level.
struct StepKind {
  Collective collective = Collective::none;
  Axis axis = Axis::data;
  int from_dim = kNoDim;  // the dim sharded before the step (as written in the layout; may be negative)
  int to_dim = kNoDim;    // the dim sharded after it
};

template <LayoutType From, LayoutType To, Axis A>
constexpr StepKind step_on() {
  using F = placement_on<From, A>;
  using T = placement_on<To, A>;
  return {axis_step<F, T>(), A, shard_dim_or_none<F>(), shard_dim_or_none<T>()};
}

// Growth of the local buffer (negative shrinks): the ordering key of steps.
constexpr int growth(Collective c) {
  switch (c) {
    case Collective::slice: case Collective::reduce_scatter: return -1;
    case Collective::all_gather: case Collective::embed: return 1;
    default: return 0;
  }
}

namespace detail {
// Whether the layout between two steps (one axis already at To, the other still at From) is valid.
template <class D, class T>
inline constexpr bool valid_pair = !(IsShard<D> && IsShard<T> && requires { requires D::dim == T::dim; });
}  // namespace detail

// The order of the two per-axis steps from From to To, decided at compile time.
template <LayoutType From, LayoutType To>
struct Transition {
  static constexpr StepKind data = step_on<From, To, Axis::data>();
  static constexpr StepKind tensor = step_on<From, To, Axis::tensor>();

  // Intermediate layouts: data step first gives <To::data, From::tensor>; tensor first the other.
  static constexpr bool data_first_ok = detail::valid_pair<typename To::data, typename From::tensor>;
  static constexpr bool tensor_first_ok = detail::valid_pair<typename From::data, typename To::tensor>;
  static constexpr bool possible = data_first_ok || tensor_first_ok;
  static constexpr bool prefer_data_first = growth(data.collective) <= growth(tensor.collective);
  static constexpr bool data_first = data_first_ok && (prefer_data_first || !tensor_first_ok);

  static constexpr std::array<StepKind, 2> steps = data_first ? std::array{data, tensor}
                                                              : std::array{tensor, data};
  static constexpr bool uses_embed = data.collective == Collective::embed ||
                                     tensor.collective == Collective::embed;
};

// Compile-time query: the collective that turns From into To on axis A.
template <LayoutType From, LayoutType To, Axis A>
inline constexpr Collective collective_on = step_on<From, To, A>().collective;

// One step of a plan, with shapes and bytes for given sizes and degrees.
struct PlanStep {
  Collective collective = Collective::none;
  Axis axis = Axis::data;
  int degree = 1;           // ranks in the axis group
  Shape local_in, local_out;
  std::int64_t bytes_in = 0;    // local buffer before the step, per rank
  std::int64_t bytes_out = 0;   // local buffer after it, per rank
  std::int64_t wire_bytes = 0;  // bytes each rank sends with ring algorithms (0 for local steps)
};

struct Plan {
  std::array<PlanStep, 2> steps{};
  int count = 0;  // steps that do anything (collective != none)

  constexpr const PlanStep* begin() const { return steps.data(); }
  constexpr const PlanStep* end() const { return steps.data() + count; }
  constexpr std::int64_t wire_bytes() const {
    std::int64_t b = 0;
    for (const PlanStep& s : *this) b += s.wire_bytes;
    return b;
  }
};

// Bytes each rank sends for collective c on n ranks, with `in` and `out` the local bytes before and
// after (ring algorithms, the convention of nccl-tests' bus bandwidth):
//   all_reduce 2 (n-1)/n S, all_gather (n-1)/n S_out, reduce_scatter (n-1)/n S_in,
//   all_to_all (n-1)/n S.
constexpr std::int64_t ring_wire_bytes(Collective c, int n, std::int64_t in, std::int64_t out) {
  switch (c) {
    case Collective::all_reduce: return 2 * (n - 1) * in / n;
    case Collective::all_gather: return (n - 1) * out / n;
    case Collective::reduce_scatter: return (n - 1) * in / n;
    case Collective::all_to_all: return (n - 1) * in / n;
    default: return 0;
  }
}

// The shape after one step on a local shape (dims normalized against the global rank).
constexpr Shape step_shape(const StepKind& k, const Shape& local, int degree) {
  Shape out = local;
  const auto grow = [&](int d) { out[local.normalize_dim(d)] *= degree; };
  const auto shrink = [&](int d) {
    const int nd = local.normalize_dim(d);
    if (degree <= 0 || local[nd] % degree != 0)
      throw Error("plan", cat("dim ", nd, " of local shape ", local, " has extent ", local[nd],
                              ", not divisible by the ", name(k.axis), " degree ", degree),
                  "choose a degree that divides the extent, or pad the tensor");
    out[nd] /= degree;
  };
  switch (k.collective) {
    case Collective::slice: case Collective::reduce_scatter: shrink(k.to_dim); break;
    case Collective::all_gather: case Collective::embed: grow(k.from_dim); break;
    case Collective::all_to_all: grow(k.from_dim); shrink(k.to_dim); break;
    default: break;
  }
  return out;
}

// The plan of redistributing a tensor of `global` shape and `elem_bytes`-byte elements from From to
// To on the degrees of `s`. Requires: the transition is possible (checked at compile time) and the
// sharded extents divide. Example (4 ranks, tensor degree 4, f32):
//   plan<Layout<Replicate, Shard<1>>, Replicated>({8, 16}, {.tensor_degree = 4}, 4)
//   == one step: all_gather on tensor, local (8, 4) -> (8, 16), 128 -> 512 bytes, 384 wire bytes.
template <LayoutType From, LayoutType To>
constexpr Plan plan(const Shape& global, const Spread& s, std::int64_t elem_bytes) {
  using Tr = Transition<From, To>;
  static_assert(Tr::possible,
                "plan: every order of the per-axis steps from From to To passes through a layout that shards "
                "one dim on both axes; redistribute through an intermediate layout (Replicate on one axis)");
  Plan p;
  Shape local = local_shape<From>(global, s);
  for (const StepKind& k : Tr::steps) {
    if (k.collective == Collective::none) continue;
    PlanStep st;
    st.collective = k.collective;
    st.axis = k.axis;
    st.degree = s.degree(k.axis);
    st.local_in = local;
    st.local_out = step_shape(k, local, st.degree);
    st.bytes_in = local.numel() * elem_bytes;
    st.bytes_out = st.local_out.numel() * elem_bytes;
    st.wire_bytes = st.degree > 1 ? ring_wire_bytes(k.collective, st.degree, st.bytes_in, st.bytes_out) : 0;
    local = st.local_out;
    p.steps[static_cast<std::size_t>(p.count++)] = st;
  }
  return p;
}

}  // namespace weft
