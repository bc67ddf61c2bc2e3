// GPT-2's sizes for the plan: a block's elements, a rank's units (footprint::Units, so that
// footprint::persistent and footprint::fits take a gpt2::Config, at compile time too), and about how
// many elements a configuration holds (the bound the planners check before planning).
//
//   embedding  wte (Vp/tp, C) and wpe (T, C)
//   h<l>       a block: qkv (3C/tp, C) + 3C/tp, proj (C, C/tp) + C, fc (4C/tp, C) + 4C/tp,
//              fc2 (C, 4C/tp) + C, two LayerNorms 2C each: 12C^2/tp + 7C/tp + 6C
//   head       ln_f, 2C
#pragma once

#include <cstdint>

#include "weft/cost/memory.hpp"
#include "weft/models/gpt2/model.hpp"

namespace weft::gpt2 {

// Local elements of one block on a tensor rank (before padding).
constexpr std::int64_t block_elements(const gpt2::Config& c, int tp) {
  const std::int64_t C = c.width;
  return 12 * C * C / tp + 7 * C / tp + 6 * C;
}

// A rank's parameter elements by unit, before padding: the one place the plan derives them, for
// the state (footprint::persistent), the step's replay (replay.hpp) and the time model
// (estimate.hpp): wte, wpe, a block, ln_f.
constexpr footprint::Units units(const gpt2::Config& c, const Spread& s) {
  return {nn::padded_vocab(c.vocab, s.tensor_degree) * c.width / s.tensor_degree, c.seq * c.width,
          block_elements(c, s.tensor_degree), 2 * c.width};
}

// About how many elements a configuration's parameters and one micro-batch of `sequences` hold,
// unsharded, in double (it cannot overflow): parameters, the residual stream and the logits, the
// attention probabilities. The plan counts in 64 bits, so callers refuse configurations beyond
// footprint::kMaxElements (petabytes) before planning them; `tensor` bounds the vocabulary's padding.
constexpr double approximate_elements(const gpt2::Config& c, double sequences, double tensor = 1) {
  const double C = static_cast<double>(c.width), L = static_cast<double>(c.layers), T = static_cast<double>(c.seq);
  const double V = static_cast<double>(c.vocab) + tensor, H = static_cast<double>(c.heads);
  return L * (12 * C * C + 13 * C) + (V + T) * C + sequences * T * (C * L + V) + L * sequences * H * T * T;
}

}  // namespace weft::gpt2
