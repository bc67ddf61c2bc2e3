// weft::footprint (the memory part of the plan): the bytes a rank of a GPT configuration holds, computed from the sizes, the
// degrees and the types (precision, data-parallel strategy, optimizer), without building anything.
// All of it is constexpr: with sizes known at compile time, a static_assert checks a budget.
//
// This part covers the persistent state, by category, as the allocators count it once the model
// and its data-parallel protocol are built (before the first step): parameters, gradients, master
// weights and optimizer state, exactly (tests/plan/memory.cpp compares it with the allocator's
// counts for every strategy). Activations, communication buffers and the transient gathers of
// sharded strategies during a step are not planned yet.
//
// A rank's units (nn/staged_model.hpp, GPT-2's in models/gpt2/model.hpp), each padded to a multiple of the data degree:
//   embedding  wte (Vp/tp, C) and wpe (T, C); on two units ("wte", "embedding") when a pipeline
//              puts the head on another rank, which then holds its own "wte" copy
//   h<l>       a block: qkv (3C/tp, C) + 3C/tp, proj (C, C/tp) + C, fc (4C/tp, C) + 4C/tp,
//              fc2 (C, 4C/tp) + C, two LayerNorms 2C each: 12C^2/tp + 7C/tp + 6C
//   head       ln_f, 2C
// Per unit of n padded elements, shard = n / dp:
//   parameters       T x (Shard<0> params ? shard : n)
//   gradients        G x (Shard<0> grads  ? shard : n)
//   optimizer state  S x states x (Shard<0> state ? shard : n)
//   master weights   G x (Shard<0> state ? shard : n), mixed precision only
// with T the compute type, G its master type, S the optimizer state type.
#pragma once

#include <array>
#include <cstdint>

#include "weft/device/allocation.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/optimizer.hpp"

namespace weft::footprint {

// Which stages a rank holds: its block count, and whether it holds the embedding and the head
// (nn::Placement, as counts).
struct Holds {
  std::int64_t blocks = 0;
  bool embedding = true, head = true;

  static constexpr Holds all(const gpt2::Config& c) { return {c.layers, true, true}; }
  // Pipe rank r of pipeline::Partition::even (layers divisible by pipe x virtual stages): its
  // share of the blocks, the embedding on rank 0, the head on the last.
  static constexpr Holds even(const gpt2::Config& c, int pipe, int r) { return {c.layers / pipe, r == 0, r == pipe - 1}; }
  static Holds of(const nn::Placement& p) {
    std::int64_t n = 0;
    for (bool b : p.blocks) n += b ? 1 : 0;
    return {n, p.embedding, p.head};
  }
};

struct Memory {
  std::array<std::int64_t, kCategories> bytes{};

  constexpr std::int64_t of(Category c) const { return bytes[static_cast<std::size_t>(c)]; }
  constexpr std::int64_t total() const {
    std::int64_t t = 0;
    for (std::int64_t b : bytes) t += b;
    return t;
  }
};

// Local elements of one block on a tensor rank (before padding).
constexpr std::int64_t block_elements(const gpt2::Config& c, int tp) {
  const std::int64_t C = c.width;
  return 12 * C * C / tp + 7 * C / tp + 6 * C;
}

// A rank's parameter elements by unit (the list above), before padding: the one place the plan
// derives them, for the state (persistent), the step's replay (step.hpp) and the time model.
struct Units {
  std::int64_t table = 0;      // wte (Vp/tp, C)
  std::int64_t positions = 0;  // wpe (T, C)
  std::int64_t block = 0;      // one block
  std::int64_t head = 0;       // ln_f

  constexpr std::int64_t embedding() const { return table + positions; }  // the unit when one rank holds both ends
};
constexpr Units units(const gpt2::Config& c, const Spread& s) {
  return {nn::padded_vocab(c.vocab, s.tensor_degree) * c.width / s.tensor_degree, c.seq * c.width,
          block_elements(c, s.tensor_degree), 2 * c.width};
}

// About how many elements a configuration's parameters and one micro-batch of `sequences` hold,
// unsharded, in double (it cannot overflow): parameters, the residual stream and the logits, the
// attention probabilities. The plan counts in 64 bits, so callers refuse configurations beyond
// kMaxElements (petabytes) before planning them; `tensor` bounds the vocabulary's padding.
constexpr double approximate_elements(const gpt2::Config& c, double sequences, double tensor = 1) {
  const double C = static_cast<double>(c.width), L = static_cast<double>(c.layers), T = static_cast<double>(c.seq);
  const double V = static_cast<double>(c.vocab) + tensor, H = static_cast<double>(c.heads);
  return L * (12 * C * C + 13 * C) + (V + T) * C + sequences * T * (C * L + V) + L * sequences * H * T * T;
}
inline constexpr double kMaxElements = 1e15;

// n elements padded to a multiple of the data degree dp (optim/data_parallel.hpp's units).
constexpr std::int64_t padded(std::int64_t n, std::int64_t dp) { return (n + dp - 1) / dp * dp; }

// The persistent bytes of one rank: a gpt2::Model<P> holding `holds`, under data-parallel Strategy with
// update rule Rule (AdamW: 2 states), on the degrees of `s`. Sizes must satisfy nn::validate.
template <class Strategy, PrecisionLike P, class Rule = optim::AdamW>
constexpr Memory persistent(const gpt2::Config& c, const Spread& s, Holds holds) {
  using T = typename precision_t<P>::compute;
  using G = master_t<T>;
  using S = optim::state_t<T>;
  constexpr bool shard_params = IsShard<typename Strategy::params>;
  constexpr bool shard_grads = IsShard<typename Strategy::grads>;
  constexpr bool shard_state = IsShard<typename Strategy::state>;
  constexpr bool mixed = !std::same_as<T, G>;
  const std::int64_t dp = s.data_degree;
  const Units u = units(c, s);
  Memory m;
  auto add = [&](std::int64_t elements, std::int64_t count) {
    const std::int64_t n = padded(elements, dp), shard = n / dp;
    auto put = [&](Category cat, std::int64_t b) { m.bytes[static_cast<std::size_t>(cat)] += b * count; };
    put(Category::parameters, static_cast<std::int64_t>(sizeof(T)) * (shard_params ? shard : n));
    put(Category::gradients, static_cast<std::int64_t>(sizeof(G)) * (shard_grads ? shard : n));
    put(Category::optimizer_state, static_cast<std::int64_t>(sizeof(S)) * Rule::states * (shard_state ? shard : n));
    if (mixed) put(Category::master_weights, static_cast<std::int64_t>(sizeof(G)) * (shard_state ? shard : n));
  };
  const bool split_tie = holds.embedding != holds.head;  // the tied table on two ranks: a unit of its own
  if (holds.embedding) {
    if (split_tie) {
      add(u.table, 1);
      add(u.positions, 1);
    } else {
      add(u.embedding(), 1);
    }
  }
  add(u.block, holds.blocks);
  if (holds.head) {
    add(u.head, 1);
    if (split_tie) add(u.table, 1);
  }
  return m;
}

// Whether the persistent state fits `budget` bytes per rank; for static_assert:
//   static_assert(footprint::fits<optim::Fsdp, Bf16Mixed>(cfg, spread, footprint::Holds::all(cfg), 80LL << 30),
//                 "the model's state does not fit 80 GiB per GPU");
template <class Strategy, PrecisionLike P, class Rule = optim::AdamW>
constexpr bool fits(const gpt2::Config& c, const Spread& s, Holds holds, std::int64_t budget) {
  return persistent<Strategy, P, Rule>(c, s, holds).total() <= budget;
}

}  // namespace weft::footprint
