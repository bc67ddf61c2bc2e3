// Side inputs: a per-sample tensor that a model's first stage produces beside the stream and that
// any layer of any block, and the head, may read (a diffusion transformer's conditioning vector,
// its timestep and class embeddings summed; pooled text embeddings), with its gradient returned to
// the first stage.
//
//   c   (B, K)  act::Full: (B/dp, K), each data rank's samples, whole on every tensor, context and
//               pipe rank (the pipeline passes it on with the stream; nn::StagedModel, pipelined.hpp)
//   dc  (B, K)  the readers' shares of c's gradient, summed: a reader adds what it computes on its
//               tensor rank and rows, so that the sum over the tensor and context ranks is the
//               gradient. A sum computed whole on every tensor rank (a reader over the whole
//               sequence, its weights replicated) is added by one of them: adds_side_share<A>.
//
// The first stage's backward receives dc summed over the tensor group (Replicate on tensor) and
// still a share over the context group (each context rank's rows'), so that the gradients of the
// weights that made c are shares over context too, as every weight gradient is under context
// parallelism (the data-parallel step sums them over data x context).
//
// The layers reach the side input through their mesh argument: a model with one (its Spec names
// side_width(config)) hands its blocks and head a mesh with the micro-batch's side input
// (nn::StageMesh, nn/stage_mesh.hpp: side(), side_grad()), and Sequential, Residual, TokenWise and
// the recompute policies pass it through as they pass the mesh. A layer that reads it requires SideMesh<M>; in a model
// without a side input it is a compile error at the layer (its static_assert names the layer and the missing producer).
//
// defines: nn::SideInput, nn::SideMesh, nn::adds_side_share
#pragma once

#include "weft/comm/redistribute.hpp"
#include "weft/nn/roles.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::nn {

template <class T, class D>
struct SideInput {
  Tensor<T, act::Full, D> value;  // c (B, K)
  Tensor<T, act::Full, D> grad;   // dc (B, K): the readers' shares, summed
};

template <class M>
concept SideMesh = AxisComms<M> && requires(M& m) {
  m.side();
  m.side_grad();
};

// Whether this rank adds its share of a side input's gradient that it computed from activations in
// layout A: every rank where A splits the rows over the tensor group (each sums its own rows), only
// tensor rank 0 where every tensor rank computed the same whole sum.
template <LayoutType A>
bool adds_side_share(const Spread& s) {
  return IsShard<typename A::tensor> || s.tensor_index == 0;
}

}  // namespace weft::nn
