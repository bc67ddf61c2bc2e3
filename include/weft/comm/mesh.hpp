// Mesh: the ranks of a world arranged as data x pipe x tensor, with a communicator per axis group.
//
// World rank = (data * pipe_degree + pipe) * tensor_degree + tensor: tensor is the fastest-varying
// axis, as in Megatron, so a tensor group is a block of consecutive ranks (one node's GPUs, where
// the bandwidth is). The axis group of an axis is the set of ranks that differ only on that axis.
// Degrees are run-time values, validated here before anything is allocated.
#pragma once

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
  int tensor = 1;
};

struct MeshCoord {
  int data = 0, pipe = 0, tensor = 0;
};

// Checks `s` against a world of `world_size` ranks; throws Error naming the values otherwise.
inline void validate(const MeshShape& s, int world_size) {
  if (s.data < 1 || s.pipe < 1 || s.tensor < 1)
    throw Error("Mesh", cat("degrees data ", s.data, ", pipe ", s.pipe, ", tensor ", s.tensor, " include one below 1"),
                "use degrees >= 1");
  const bool overflows = 1.0 * s.data * s.pipe * s.tensor > 9.0e18;  // each degree is an int: up to 2^93
  const long long product = overflows ? 0 : 1LL * s.data * s.pipe * s.tensor;
  if (overflows || product != world_size)
    throw Error("Mesh",
                cat("data ", s.data, " x pipe ", s.pipe, " x tensor ", s.tensor, " = ",
                    overflows ? cat(1.0 * s.data * s.pipe * s.tensor) : cat(product), " ranks, but the world has ", world_size),
                cat("choose degrees whose product is ", world_size, " (each one of ", list_divisors(world_size, s.tensor, 12),
                    world_size > 1024 ? ", ..." : "", ")"));
}

template <Communicator C>
class Mesh {
 public:
  Mesh(C& world, MeshShape shape) : world_(world), shape_(shape) {
    validate(shape_, world.size());
    const int r = world.rank();
    coord_.tensor = r % shape_.tensor;
    coord_.pipe = (r / shape_.tensor) % shape_.pipe;
    coord_.data = r / (shape_.tensor * shape_.pipe);
    // Each split is collective over the world; every rank makes the same three calls in order.
    // The members of this rank's group on an axis: the world ranks that differ only on that axis.
    const auto members = [&](Axis a) {
      const int n = a == Axis::data ? shape_.data : a == Axis::pipe ? shape_.pipe : shape_.tensor;
      std::vector<int> m;
      for (int i = 0; i < n; ++i) {
        MeshCoord x = coord_;
        (a == Axis::data ? x.data : a == Axis::pipe ? x.pipe : x.tensor) = i;
        m.push_back((x.data * shape_.pipe + x.pipe) * shape_.tensor + x.tensor);
      }
      return m;
    };
    tensor_.emplace_back(subgroup(world, coord_.data * shape_.pipe + coord_.pipe, coord_.tensor, members(Axis::tensor),
                                  cat("tensor[d", coord_.data, ",p", coord_.pipe, "]")));
    data_.emplace_back(subgroup(world, coord_.pipe * shape_.tensor + coord_.tensor, coord_.data, members(Axis::data),
                                cat("data[p", coord_.pipe, ",t", coord_.tensor, "]")));
    pipe_.emplace_back(subgroup(world, coord_.data * shape_.tensor + coord_.tensor, coord_.pipe, members(Axis::pipe),
                                cat("pipe[d", coord_.data, ",t", coord_.tensor, "]")));
  }

  C& world() { return world_; }
  C& data() { return data_.front(); }
  C& pipe() { return pipe_.front(); }
  C& tensor() { return tensor_.front(); }
  C& comm(Axis a) { return a == Axis::data ? data() : a == Axis::pipe ? pipe() : tensor(); }

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }

  // The run-time side of a tensor layout on this mesh: every axis's degree and this rank's index.
  Spread spread() const {
    return {.data_degree = shape_.data, .tensor_degree = shape_.tensor, .data_index = coord_.data,
            .tensor_index = coord_.tensor, .pipe_degree = shape_.pipe, .pipe_index = coord_.pipe};
  }

 private:
  C& world_;
  MeshShape shape_;
  MeshCoord coord_;
  // One element each; vectors because C need not be default-constructible.
  std::vector<C> data_, pipe_, tensor_;
};

}  // namespace weft
