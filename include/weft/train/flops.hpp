// Model FLOPs per token of a training step (forward and backward) from what a model's layers
// declare, as in the PaLM paper's appendix:
//   6 N + 12 L C T
// N: the logical elements of every parameter of rank 2 or more that the layers declare (matrices
// and embedding tables, a padded vocabulary's rows left out; vectors such as biases and norm
// weights left out, as GPT-2's count leaves them; a tied table once); L, C, T: the configuration's
// layers, width and sequence length (the second term is each block's attention scores and their
// use, over the whole width). For GPT-2 this is gpt2::flops_per_token exactly
// (tests/train/flops.cpp). A family that computes differently says so (Family::flops_per_token).
// family_flops_per_token<F>(config): a family's count without training it (the --plan of the
// trainer and weft-plan's), the model built on the Meta device as rank 0 of a world of one.
#pragma once

#include <cstddef>
#include <span>

#include "weft/comm/communicator.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/meta.hpp"
#include "weft/nn/unit.hpp"
#include "weft/ops/all.hpp"
#include "weft/train/family.hpp"

namespace weft::train {

// The parameters in matrices that this rank's units hold (the head's copy of a tied table is not
// counted: the embedding's rank counts it).
template <class Model>
double matrix_parameters_here(Model& m) {
  double n = 0;
  const auto units = m.units();
  for (std::size_t i = 0; i < units.size(); ++i) {
    if (m.tied_copy() && m.tied_unit() == i) continue;
    for (const nn::UnitEntry& e : units[i].entries())
      if (e.logical.rank() >= 2) n += static_cast<double>(e.logical.numel());
  }
  return n;
}

// 6 N + 12 L C T for the whole model: N summed over the pipeline's ranks (a collective on the
// pipe axis: call on every rank; the data and tensor ranks of a stage hold the same entries).
template <class Model, class Mesh>
double declared_flops_per_token(Model& m, Mesh& mesh) {
  double n[1] = {matrix_parameters_here(m)};
  mesh.pipe().all_reduce(std::span<double>(n), ReduceOp::sum);
  const auto& c = m.config;
  const double L = static_cast<double>(c.layers), C = static_cast<double>(c.width), T = static_cast<double>(c.seq);
  return 6.0 * n[0] + 12.0 * L * C * T;
}

// FLOPs per token of a family's configuration without training it: the family's own count, or
// the parameters its layers declare (nothing allocated, no thread started).
template <Family F>
double family_flops_per_token(const config_t<F>& cfg) {
  if constexpr (requires { F::flops_per_token(cfg); }) {
    return F::flops_per_token(cfg);
  } else {
    Meta<Host> dev;
    MetaComm<StandIn> world(StandIn(0, 1));
    Mesh mesh{world, {}};
    model_t<F, F32, false, Meta<Host>> m(dev, cfg, mesh.spread(), 1);
    return declared_flops_per_token(m, mesh);
  }
}

}  // namespace weft::train
