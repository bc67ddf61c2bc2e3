// FLOPs per token of a family's configuration without training it: the family's own count, or
// from the parameters its layers declare (train/flops.hpp), the model built on the Meta device as
// rank 0 of a world of one (nothing allocated, no thread started).
#pragma once

#include "weft/comm/mesh.hpp"
#include "weft/comm/meta.hpp"
#include "weft/ops/families.hpp"
#include "weft/train/family.hpp"
#include "weft/train/flops.hpp"

namespace weft::train {

template <Family F>
double plan_flops_per_token(const config_t<F>& cfg) {
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
