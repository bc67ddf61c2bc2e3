// Padding: samples shorter than the model's sequence, padded at the end. A model's inputs declare it
// with a field of lengths, and every layer that must ignore the padding reads them through its mesh
// argument, as it reads a side input (nn/side.hpp).
//
//   lengths  (B/dp) int32   sample b's positions 0 .. lengths[b]-1 hold data, the rest padding; each
//                           length in [1, T] (nn::StagedModel::in_flight refuses others by name)
//
// An input type with a field `lengths` (a span of int32, listed by for_each_field like any field) is
// padded (nn::PaddedInputs, nn/batch.hpp). nn::StagedModel then hands its blocks and head a mesh with the
// micro-batch's lengths in the device's memory and in host memory (nn::StageMesh,
// nn/stage_mesh.hpp: lengths(), host_lengths()). What reads them:
//   nn::GroupedQueryAttention   hides the padded keys from every query (ops::Mask's lengths), on one
//                               rank and over the context group (ring and all-gather)
//   nn::MseHeadStage            leaves the padded rows out of the loss: the mean squared error over
//                               the valid rows of the global batch, their count summed with the loss
//                               in its one all-reduce (16 bytes where an unpadded batch has 8)
// A padded row is still computed (its outputs are the loss's to ignore: no gradient comes back
// through it), so the layers between need nothing: rows are independent everywhere but in attention.
// Lengths are positions of the whole sequence, so one batch serves every layout: a context rank's
// chunks and a tensor rank's slice under sequence parallelism hold the rows at their own positions.
//
// defines: nn::PaddedMesh, nn::lengths_of, nn::valid_rows
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>

#include "weft/comm/redistribute.hpp"
#include "weft/nn/batch.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/positions.hpp"

namespace weft::nn {

template <class M>
concept PaddedMesh = AxisComms<M> && requires(M& m) {
  { m.lengths() } -> std::same_as<const std::int32_t*>;
  { m.host_lengths() } -> std::same_as<std::span<const std::int32_t>>;
};

// The lengths an op's mask reads (ops::Mask::lengths): the mesh's, or none.
template <class M>
const std::int32_t* lengths_of(M& mesh) {
  if constexpr (PaddedMesh<M>) return mesh.lengths();
  else return nullptr;
}

// How many of the Tl rows at positions pos of each of the samples lie before their sample's length;
// f(b, t, n) for each run of n padded rows from local row t of sample b (at most two a sample: a
// context rank's two chunks).
template <class F>
std::int64_t valid_rows(std::span<const std::int32_t> lengths, ops::Positions pos, std::int64_t Tl, F&& padded) {
  std::int64_t valid = 0;
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (std::int64_t t = 0; t < Tl;) {
      const std::int64_t end = t < pos.split ? std::min(Tl, pos.split) : Tl;  // a run of consecutive positions
      const std::int64_t n = std::clamp<std::int64_t>(lengths[b] - pos.at(t), 0, end - t);
      valid += n;
      if (t + n < end) padded(static_cast<std::int64_t>(b), t + n, end - t - n);
      t = end;
    }
  return valid;
}

}  // namespace weft::nn
