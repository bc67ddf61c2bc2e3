// One forward and backward of a staged model on one micro-batch through the executor, gradients
// left where the layers put them (no data-parallel strategy), for tests that inspect gradients.
#pragma once

#include <span>
#include <vector>

#include "weft/pipeline/executor.hpp"

namespace weft::test {

// Returns the loss; logits, when given, receive this rank's logits (B/dp, T, Vp/tp), padding included.
template <class Model, class M>
double forward_backward(Model& model, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                        std::int64_t batch, M& mesh, std::vector<typename Model::value_type>* logits = nullptr) {
  auto ctx = model.in_flight({{tokens, targets}, batch});
  pipeline::forward(model, ctx, mesh);
  if (logits) *logits = ctx.head.ce.logits.to_host();
  pipeline::backward(model, ctx, mesh);
  return ctx.loss;
}

}  // namespace weft::test
