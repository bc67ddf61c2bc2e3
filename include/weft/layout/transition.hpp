// Which collective turns one layout into another, decided at compile time (Transition), and the
// steps of a redistribution (collective, axis, bytes) for given shapes and degrees
// (redistribution<From, To>: a Redistribution of CommSteps).
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
// A redistribution is one step per mesh axis. Steps that shrink the local buffer (slice,
// reduce_scatter) run first, so the growing ones (all_gather) move fewer bytes, unless that order
// passes through a layout that shards one dim on two axes; when every order does, the transition
// is refused at compile time (go through an intermediate layout).
//
// This header is plain C++20 (no CUDA, MPI, NCCL or Eigen).
#pragma once

#include <algorithm>
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
  send_recv,       // not a redistribution: a block sent to the next rank of a ring and one received
                   // from the previous (context::Ring's attention; a row of describe, never a step)
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
    case Collective::send_recv: return "send_recv";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, Collective c) { return os << name(c); }

// True when the step moves data between ranks.
constexpr bool communicates(Collective c) {
  return c == Collective::all_gather || c == Collective::all_to_all || c == Collective::all_reduce ||
         c == Collective::reduce_scatter || c == Collective::send_recv;
}

// The step on one axis from placement From to placement To (embed included: it is the adjoint of
// slice). The dims of the step are the From shard dim and the To shard dim, or kNoDim.
inline constexpr int kNoDim = 1 << 20;

template <Placement From, Placement To>
constexpr Collective axis_step() {
  if constexpr (IsStageLocal<From> || IsStageLocal<To>) {
    return Collective::none;  // both StageLocal; a transition between stages is refused (crosses_stages)
  } else if constexpr (IsReplicate<From>) {
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
    case Collective::slice:
    case Collective::reduce_scatter: return -1;
    case Collective::all_gather:
    case Collective::embed: return 1;
    default: return 0;
  }
}

// The order of the per-axis steps from From to To, decided at compile time: steps that shrink the
// local buffer first, then those that keep it, then those that grow it (mesh order among equals;
// steps that do nothing last), unless that order passes through a layout that shards one dim on
// two axes, in which case the first valid order of all. possible is false when none is valid.
template <LayoutType From, LayoutType To>
struct Transition {
  static constexpr std::size_t n = kAxes.size();

 private:
  using Steps = std::array<StepKind, n>;
  static constexpr Steps per_axis() {
    Steps s{};
    std::size_t i = 0;
    for_each_axis([&](auto a) { s[i++] = step_on<From, To, decltype(a)::value>(); });
    return s;
  }
  static constexpr Steps kinds = per_axis();

  // Whether every layout on the way (From, and the layout after each step of `order`) shards each
  // dim on one axis only, or nests a dim in the one way a Layout may (context outer, tensor inner:
  // sequence parallelism inside context parallelism) while the context placement stays as it is.
  // The tensor-axis step then works on a context rank's rows alone, which its local buffer is; a
  // context-axis step under a nested tensor shard would interleave the wrong slices. Dims are
  // compared as written (Shard<1> vs Shard<1>), as the Layout static_assert does.
  static constexpr bool nests(std::size_t i, std::size_t j) {
    return kAxes[i] == Axis::context && kAxes[j] == Axis::tensor && kinds[i].collective == Collective::none;
  }
  static constexpr bool apart(const std::array<int, n>& dims) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j)
        if (dims[i] != kNoDim && dims[i] == dims[j] && !nests(i, j)) return false;
    return true;
  }
  static constexpr bool valid(const std::array<std::size_t, n>& order) {
    std::array<int, n> dims{};
    for (std::size_t i = 0; i < n; ++i) dims[i] = kinds[i].from_dim;
    if (!apart(dims)) return false;
    for (std::size_t k = 0; k < n; ++k) {
      dims[order[k]] = kinds[order[k]].to_dim;
      if (!apart(dims)) return false;
    }
    return true;
  }
  static constexpr int key(const StepKind& k) { return k.collective == Collective::none ? 2 : growth(k.collective); }
  static constexpr std::array<std::size_t, n> preferred() {
    std::array<std::size_t, n> o{};
    for (std::size_t i = 0; i < n; ++i) o[i] = i;
    for (std::size_t i = 1; i < n; ++i)  // stable insertion sort by key
      for (std::size_t j = i; j > 0 && key(kinds[o[j]]) < key(kinds[o[j - 1]]); --j) std::swap(o[j], o[j - 1]);
    return o;
  }
  struct Choice {
    std::array<std::size_t, n> order{};
    bool found = false;
  };
  static constexpr Choice choose() {
    Choice c{preferred(), true};
    if (valid(c.order)) return c;
    std::array<std::size_t, n> o{};
    for (std::size_t i = 0; i < n; ++i) o[i] = i;
    do {
      if (valid(o)) return {o, true};
    } while (std::next_permutation(o.begin(), o.end()));
    return {c.order, false};
  }
  static constexpr Choice choice = choose();
  // The chosen order with the steps that do nothing moved last (they change no layout, so the
  // order stays valid).
  static constexpr Steps ordered() {
    Steps s{};
    std::size_t k = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t i = 0; i < n; ++i)
        if ((kinds[choice.order[i]].collective == Collective::none) == (pass == 1)) s[k++] = kinds[choice.order[i]];
    return s;
  }

 public:
  // A tensor of one pipeline stage does not become a tensor spread over pipe ranks (or back).
  static constexpr bool crosses_stages = IsStageLocal<typename From::pipe> != IsStageLocal<typename To::pipe>;
  static constexpr bool possible = choice.found && !crosses_stages;
  static constexpr Steps steps = ordered();
  static constexpr bool uses_embed = [] {
    for (const StepKind& k : kinds)
      if (k.collective == Collective::embed) return true;
    return false;
  }();
};

// Compile-time query: the collective that turns From into To on axis A.
template <LayoutType From, LayoutType To, Axis A>
inline constexpr Collective collective_on = step_on<From, To, A>().collective;

// One collective step of a redistribution, with shapes and bytes for given sizes and degrees.
struct CommStep {
  Collective collective = Collective::none;
  Axis axis = Axis::data;
  int degree = 1;  // ranks in the axis group
  Shape local_in, local_out;
  std::int64_t bytes_in = 0;    // local buffer before the step, per rank
  std::int64_t bytes_out = 0;   // local buffer after it, per rank
  std::int64_t wire_bytes = 0;  // bytes each rank sends with ring algorithms (0 for local steps)
};

struct Redistribution {
  std::array<CommStep, kAxes.size()> steps{};
  int count = 0;  // steps that do anything (collective != none)

  constexpr const CommStep* begin() const { return steps.data(); }
  constexpr const CommStep* end() const { return steps.data() + count; }
  constexpr std::int64_t wire_bytes() const {
    std::int64_t b = 0;
    for (const CommStep& s : *this) b += s.wire_bytes;
    return b;
  }
};

// Bytes each rank sends for collective c on n ranks, with `in` and `out` the local bytes before and
// after (ring algorithms, the convention of nccl-tests' bus bandwidth):
//   all_reduce 2 (n-1)/n S, all_gather (n-1)/n S_out, reduce_scatter (n-1)/n S_in,
//   all_to_all (n-1)/n S, send_recv S (the block sent).
constexpr std::int64_t ring_wire_bytes(Collective c, int n, std::int64_t in, std::int64_t out) {
  switch (c) {
    case Collective::send_recv: return in;
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
      throw Error("redistribution",
                  cat("dim ", nd, " of local shape ", local, " has extent ", local[nd], ", not divisible by the ",
                      name(k.axis), " degree ", degree),
                  "choose a degree that divides the extent, or pad the tensor");
    out[nd] /= degree;
  };
  switch (k.collective) {
    case Collective::slice:
    case Collective::reduce_scatter: shrink(k.to_dim); break;
    case Collective::all_gather:
    case Collective::embed: grow(k.from_dim); break;
    case Collective::all_to_all:
      grow(k.from_dim);
      shrink(k.to_dim);
      break;
    default: break;
  }
  return out;
}

// The steps of redistributing a tensor of `global` shape and `elem_bytes`-byte elements from From to
// To on the degrees of `s`. Requires: the transition is possible (checked at compile time) and the
// sharded extents divide. Example (4 ranks, tensor degree 4, f32):
//   redistribution<Layout<Replicate, Shard<1>>, Replicated>({8, 16}, {.tensor_degree = 4}, 4)
//   == one step: all_gather on tensor, local (8, 4) -> (8, 16), 128 -> 512 bytes, 384 wire bytes.
template <LayoutType From, LayoutType To>
constexpr Redistribution redistribution(const Shape& global, const Spread& s, std::int64_t elem_bytes) {
  using Tr = Transition<From, To>;
  static_assert(!Tr::crosses_stages,
                "redistribution: one layout is StageLocal on the pipe axis and the other is not; tensors move between "
                "pipeline stages by send/recv (the pipeline executor), not by redistribution");
  static_assert(Tr::crosses_stages || Tr::possible,
                "redistribution: every order of the per-axis steps from From to To passes through a layout that shards "
                "one dim on both axes; redistribute through an intermediate layout (Replicate on one axis)");
  Redistribution p;
  Shape local = local_shape<From>(global, s);
  for (const StepKind& k : Tr::steps) {
    if (k.collective == Collective::none) continue;
    CommStep st;
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
