// Recompute (activation checkpointing) policies, a type parameter of a block (gpt2::Spec::Block, llama::Spec::Block),
// applied by recompute::apply_t (checkpointed.hpp: Full, the same for every block) and by the layers (Selective).
//
//   None       keep everything the backward needs
//   Full       keep only the block input; backward re-runs the block's forward (its collectives too)
//   Selective  keep everything but the attention probabilities (B, H/tp, T, T), which backward
//              recomputes from the saved qkv (Korthikanti et al., 2022): the largest activation for
//              long sequences, and the cheapest to recompute
//
// Gradients are bitwise identical under all three on the host: recomputation runs the same code on
// the same inputs.
#pragma once

#include <concepts>

namespace weft::recompute {

struct None {};
struct Full {};
struct Selective {};

template <class P>
concept Policy = std::same_as<P, None> || std::same_as<P, Full> || std::same_as<P, Selective>;

}  // namespace weft::recompute
