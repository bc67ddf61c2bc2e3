// nn::stream<SP, CP>: the layout of the residual stream between a model's stages and blocks, and
// the tensor-axis pairs around a branch (Megatron's):
//
//   SP  CP   stream (B, T, C)                                   enter / leave a branch
//   no  no   act::Full      Replicate                          CopyToTensor / ReduceFromTensor
//   yes no   act::Sequence  Shard<1> on tensor (B, T/tp, C)     GatherFromSequence / ScatterToSequence
//   no  yes  act::Rows      a context rank's rows (B, T/c, C)   CopyToTensorRows / ReduceFromTensorRows
//   yes yes  act::RowsSequence  those rows split over tensor    GatherFromSequenceRows / ScatterToSequenceRows
//
// defines: nn::stream
#pragma once

#include <type_traits>

#include "weft/nn/comm.hpp"

namespace weft::nn {

// The stream between a model's stages and blocks, and the tensor-axis pairs around a branch. Under
// context parallelism (CP: the sequence Shard<1> on the context axis, docs/context.md) the stream is a
// context rank's rows, and the pairs keep them so; with sequence parallelism as well, the rows are
// split again over the tensor group (act::RowsSequence) and the pairs gather and scatter them.
template <bool SP, bool CP = false>
struct stream {
  using layout = std::conditional_t<CP, std::conditional_t<SP, act::RowsSequence, act::Rows>,
                                    std::conditional_t<SP, act::Sequence, act::Full>>;
  using enter = std::conditional_t<CP, std::conditional_t<SP, GatherFromSequenceRows, CopyToTensorRows>,
                                   std::conditional_t<SP, GatherFromSequence, CopyToTensor>>;
  using leave = std::conditional_t<CP, std::conditional_t<SP, ScatterToSequenceRows, ReduceFromTensorRows>,
                                   std::conditional_t<SP, ScatterToSequence, ReduceFromTensor>>;
};

}  // namespace weft::nn
