// The decoder of 03_custom_model.hpp as a model family (train::Family) for weft's trainer library:
// its trainer (03_custom_model_train.cpp) and its planner (03_custom_model_plan.cpp) are each a
// main over it.
#pragma once

#include "03_custom_model.hpp"

#include <string>
#include <string_view>
#include <vector>
#include <weft/train/family.hpp>

namespace custom {

struct Family {
  template <class P, bool SP, class D>
  using model = custom::Model<P, SP, D>;
  // What the binaries compile (each a loop instantiation; fewer build faster): DDP and ZeRO-1, with
  // and without SP, in f32 and f64.
  using strategies = weft::train::List<weft::optim::Ddp, weft::optim::Zero1>;
  using host_precisions = weft::train::List<weft::F32, weft::F64>;

  static std::string name() { return "custom"; }
  static std::vector<std::string> preset_names() { return {"tiny"}; }
  static weft::gpt2::Config preset(std::string_view) {
    return {.vocab = 64, .seq = 32, .layers = 2, .heads = 4, .width = 64, .seed = 1, .init_std = 0.02};
  }
  // FLOPs per token for MFU: from the parameters the layers declare (weft/train/flops.hpp).
};

}  // namespace custom
