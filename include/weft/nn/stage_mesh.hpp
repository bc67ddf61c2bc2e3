// StageMesh: the mesh nn::StagedModel hands its blocks and head, for one micro-batch in flight: the
// mesh's communicators and what the layers may read of the micro-batch beyond the stream.
//
//   comm(axis)        the mesh's communicator on an axis (AxisComms: all a layer needs of a mesh)
//   grad_scale()      the micro-batch's weight in the step's loss (1/k when accumulating k): a layer
//                     that adds a loss of its own (nn::MoeMlp's router losses) scales its gradient by it
//   side(), side_grad()          a sided model's side input and its gradient (nn/side.hpp; SideMesh)
//   lengths(), host_lengths()    a padded batch's lengths, on the device and in host memory
//                                (nn/padding.hpp; PaddedMesh)
//
// A layer that reads one of the optional parts requires its concept; in a model without it the
// member is not there (a compile error at the layer, which names the missing producer). Sequential,
// Residual, TokenWise and the recompute policies pass the mesh on as they receive it.
//
// defines: nn::StageMesh, nn::grad_scale_of
#pragma once

#include <cstdint>
#include <span>

#include "weft/comm/redistribute.hpp"
#include "weft/nn/side.hpp"

namespace weft::nn {

template <AxisComms M, class T, class D, bool Sided, bool Padded>
class StageMesh {
 public:
  StageMesh(M& mesh, double grad_scale, SideInput<T, D>* side, const std::int32_t* lengths,
            std::span<const std::int32_t> host_lengths)
      : mesh_(&mesh), scale_(grad_scale), side_(side), lengths_(lengths), host_(host_lengths) {}
  decltype(auto) comm(Axis a) { return mesh_->comm(a); }
  double grad_scale() const { return scale_; }

  const Tensor<T, act::Full, D>& side() const  // (B/dp, K)
    requires Sided
  {
    return side_->value;
  }
  Tensor<T, act::Full, D>& side_grad()  // (B/dp, K), added to
    requires Sided
  {
    return side_->grad;
  }
  const std::int32_t* lengths() const  // (B/dp) in the device's memory
    requires Padded
  {
    return lengths_;
  }
  std::span<const std::int32_t> host_lengths() const  // the same in host memory
    requires Padded
  {
    return host_;
  }

 private:
  M* mesh_;
  double scale_;
  SideInput<T, D>* side_;
  const std::int32_t* lengths_;
  std::span<const std::int32_t> host_;
};

// The micro-batch's weight where the mesh says it (a StageMesh), else 1 (a layer run on its own).
template <class M>
double grad_scale_of(M& mesh) {
  if constexpr (requires { mesh.grad_scale(); }) return mesh.grad_scale();
  else return 1.0;
}

}  // namespace weft::nn
