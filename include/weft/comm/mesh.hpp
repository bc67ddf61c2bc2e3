// Mesh: the ranks of a world arranged as data x pipe x context x tensor, with a communicator per
// axis group.
//
// World rank = ((data * pipe_degree + pipe) * context_degree + context) * tensor_degree + tensor:
// tensor is the fastest-varying axis, as in Megatron, so a tensor group is a block of consecutive
// ranks (one node's GPUs, where the bandwidth is); context (context parallelism's ring or gather of
// keys and values, docs/context.md) comes next, as in Megatron's tp-cp-dp-pp order, then pipe, then
// data, the slowest. The axis group of an axis is the set of ranks that differ only on that axis.
// Degrees are run-time values, validated here before anything is allocated. Without context
// parallelism (context 1) ranks, groups and their names are what they were before the axis; each
// rank's context group is then the rank alone.
//
// The expert axis (expert parallelism, docs/moe.md) is carved from each data x context group rather
// than multiplied into the world, as Megatron's expert-model-parallel groups are: that group's ranks
// (data-major, d * context + c) fall into blocks of `expert` consecutive ones, the expert groups
// (comm(Axis::expert); a rank's expert index is its place in its block), and the ranks of one
// expert index across the blocks form its expert-data group (expert_data()), which holds the same
// experts and reduces their gradients. Consecutive, so that an expert group's all-to-alls stay on
// a node where the data ranks of a node are neighbours.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/core/divisors.hpp"
#include "weft/core/error.hpp"
#include "weft/layout/layout.hpp"

namespace weft {

struct MeshShape {
  int data = 1;
  int pipe = 1;
  int context = 1;
  int tensor = 1;
  int expert = 1;  // carved from data x context: divides data * context

  constexpr int ranks() const { return data * pipe * context * tensor; }  // the world's size
};

struct MeshCoord {
  int data = 0, pipe = 0, context = 0, tensor = 0;
  int expert = 0;  // (data * context degree + context) mod the expert degree; not in the world rank

  // The index on axis a.
  constexpr int& at(Axis a) {
    return a == Axis::data      ? data
           : a == Axis::pipe    ? pipe
           : a == Axis::context ? context
           : a == Axis::expert  ? expert
                                : tensor;
  }
  constexpr int at(Axis a) const { return const_cast<MeshCoord&>(*this).at(a); }
};

// Checks `s` against a world of `world_size` ranks; throws Error naming the values otherwise (the
// context degree named where it is not 1).
inline void validate(const MeshShape& s, int world_size) {
  const std::string context = s.context == 1 ? std::string() : cat(" x context ", s.context);
  if (s.data < 1 || s.pipe < 1 || s.context < 1 || s.tensor < 1)
    throw Error(
        "Mesh",
        cat("degrees data ", s.data, " x pipe ", s.pipe, context, " x tensor ", s.tensor, " include one below 1"),
        "use degrees >= 1");
  const double approx = 1.0 * s.data * s.pipe * s.context * s.tensor;
  const bool overflows = approx > 9.0e18;  // each degree is an int: up to 2^124
  const long long product = overflows ? 0 : 1LL * s.data * s.pipe * s.context * s.tensor;
  if (overflows || product != world_size)
    throw Error("Mesh",
                cat("data ", s.data, " x pipe ", s.pipe, context, " x tensor ", s.tensor, " = ",
                    overflows ? cat(approx) : cat(product), " ranks, but the world has ", world_size),
                cat("choose degrees whose product is ", world_size, " (each one of ",
                    list_divisors(world_size, s.tensor, 12), world_size > 1024 ? ", ..." : "", ")"));
  if (s.expert < 1 || (s.data * s.context) % s.expert != 0)
    throw Error(
        "Mesh",
        cat("expert degree ", s.expert, " for data ", s.data, context, ": the expert groups are carved from the ",
            s.data * s.context, " data", s.context == 1 ? "" : " x context", " ranks"),
        cat("choose an expert degree that divides ", s.data * s.context, " (one of ",
            list_divisors(s.data * s.context, 1, 12), ")"));
}

// The world rank at coordinate x of a mesh of shape s.
constexpr int world_rank(const MeshShape& s, const MeshCoord& x) {
  return ((x.data * s.pipe + x.pipe) * s.context + x.context) * s.tensor + x.tensor;
}

// The coordinate of world rank r on a mesh of shape s.
constexpr MeshCoord mesh_coord(const MeshShape& s, int r) {
  MeshCoord x{.data = r / (s.tensor * s.context * s.pipe),
              .pipe = (r / (s.tensor * s.context)) % s.pipe,
              .context = (r / s.tensor) % s.context,
              .tensor = r % s.tensor};
  x.expert = (x.data * s.context + x.context) % s.expert;
  return x;
}

template <Communicator C>
class Mesh {
 public:
  Mesh(C& world, MeshShape shape) : world_(world), shape_(shape) {
    validate(shape_, world.size());
    coord_ = mesh_coord(shape_, world.rank());
    const auto degree = [&](Axis a) { return spread().degree(a); };
    const auto index = [](const MeshCoord& x, Axis a) { return x.at(a); };
    // The members of this rank's group on an axis: the world ranks that differ only on that axis,
    // in the order of their index on it.
    const auto members = [&](Axis a) {
      std::vector<int> m;
      for (int i = 0; i < degree(a); ++i) {
        MeshCoord x = coord_;
        x.at(a) = i;
        m.push_back(world_rank(shape_, x));
      }
      return m;
    };
    // A group's color: this rank's coordinate on the other axes, as one number (mixed radix); its
    // name: those coordinates ("tensor[d0,p1]"; a context index only where context > 1).
    const auto color = [&](Axis a) {
      int c = 0;
      for (Axis b : kWorldAxes)
        if (b != a) c = c * degree(b) + index(coord_, b);
      return c;
    };
    const auto group_name = [&](Axis a) {
      std::string n = cat(name(a), "[");
      for (Axis b : kWorldAxes)
        if (b != a && (b != Axis::context || shape_.context > 1))
          n += cat(n.back() == '[' ? "" : ",", name(b)[0], index(coord_, b));
      return n + "]";
    };
    // Each split is collective over the world; every rank makes the same four calls in this order
    // (context last, so that the groups of a mesh without context parallelism come as they did).
    for (Axis a : {Axis::tensor, Axis::data, Axis::pipe, Axis::context})
      comms_[static_cast<std::size_t>(a)].emplace_back(
          subgroup(world, color(a), index(coord_, a), members(a), group_name(a)));
    // With context parallelism, a fifth: the ranks that differ on data or context (the group that
    // reduces parameter gradients, as Megatron folds context ranks into the data-parallel group).
    if (shape_.context > 1) {
      std::vector<int> m;
      for (int d = 0; d < shape_.data; ++d)
        for (int c = 0; c < shape_.context; ++c) {
          MeshCoord x = coord_;
          x.data = d;
          x.context = c;
          m.push_back(world_rank(shape_, x));
        }
      data_context_.emplace_back(subgroup(world, coord_.pipe * shape_.tensor + coord_.tensor,
                                          coord_.data * shape_.context + coord_.context, m,
                                          cat("data_context[p", coord_.pipe, ",t", coord_.tensor, "]")));
    }
    // The expert groups, split from the data x context group (collective over it; every mesh makes
    // the split, a group of one rank each where the expert degree is 1), and the expert-data groups
    // where the degree is above 1 (else the data x context group itself).
    C& dc = data_context();
    const int e = shape_.expert, i = coord_.data * shape_.context + coord_.context, blocks = dc.size() / e;
    std::vector<int> block, across;
    for (int j = 0; j < e; ++j) block.push_back(i / e * e + j);
    for (int b = 0; b < blocks; ++b) across.push_back(b * e + i % e);
    comms_[static_cast<std::size_t>(Axis::expert)].emplace_back(
        subgroup(dc, i / e, i % e, block, cat("expert[p", coord_.pipe, ",t", coord_.tensor, ",b", i / e, "]")));
    if (e > 1)
      expert_data_.emplace_back(
          subgroup(dc, i % e, i / e, across, cat("expert_data[p", coord_.pipe, ",t", coord_.tensor, ",e", i % e, "]")));
  }

  C& world() { return world_; }
  C& data() { return comm(Axis::data); }
  C& pipe() { return comm(Axis::pipe); }
  C& context() { return comm(Axis::context); }
  C& tensor() { return comm(Axis::tensor); }
  C& comm(Axis a) { return comms_[static_cast<std::size_t>(a)].front(); }
  // The data x context ranks of this rank (data-major: rank d * context + c), which hold the same
  // parameters and reduce their gradients together; the data group where context is 1.
  C& data_context() { return data_context_.empty() ? data() : data_context_.front(); }
  // The data x context ranks of this rank's expert index (in block order), which hold the same
  // experts and reduce their gradients together; the data x context group where expert is 1.
  C& expert_data() { return expert_data_.empty() ? data_context() : expert_data_.front(); }

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }

  // The run-time side of a tensor layout on this mesh: every axis's degree and this rank's index.
  Spread spread() const {
    return {.data_degree = shape_.data,
            .tensor_degree = shape_.tensor,
            .data_index = coord_.data,
            .tensor_index = coord_.tensor,
            .pipe_degree = shape_.pipe,
            .pipe_index = coord_.pipe,
            .context_degree = shape_.context,
            .context_index = coord_.context,
            .expert_degree = shape_.expert,
            .expert_index = coord_.expert};
  }

 private:
  C& world_;
  MeshShape shape_;
  MeshCoord coord_;
  // Per axis (kAxes order), one element each; vectors because C need not be default-constructible.
  std::array<std::vector<C>, kAxes.size()> comms_;
  std::vector<C> data_context_, expert_data_;
};

}  // namespace weft
