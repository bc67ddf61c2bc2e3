// weft::footprint (the memory part of the plan): the persistent bytes a rank holds, by category,
// computed from its units' sizes, the degrees and the types (precision, data-parallel strategy,
// optimizer), without building anything. All of it is constexpr: a model that gives its units'
// sizes at compile time (a constexpr `units(config, spread)` found beside its configuration, as
// GPT-2's in models/gpt2/footprint.hpp) gets fits(), a budget as a static_assert.
//
// This part covers the persistent state, by category, as the allocators count it once the model
// and its data-parallel protocol are built (before the first step): parameters, gradients, master
// weights and optimizer state, exactly (tests/cost/memory.cpp compares it with the allocator's
// counts for every strategy). A step's activations, buffers and collectives: cost/measure.hpp, for
// any model; GPT-2's closed-form replay of them, models/gpt2/replay.hpp.
//
// A rank's units (nn/staged_model.hpp), each padded to a multiple of the data degree:
//   embedding  the table and the positions; on two units ("<table>", "embedding") when a pipeline
//              puts the head on another rank, which then holds its own copy of a tied table
//   block      one per layer the rank holds
//   head       its norm (and, untied, its own table)
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
#include "weft/nn/staged_model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/optimizer.hpp"

namespace weft::footprint {

// Which stages a rank holds: its block count, and whether it holds the embedding and the head
// (nn::Parts, as counts).
struct Holds {
  std::int64_t blocks = 0;
  bool embedding = true, head = true;

  template <nn::ModelConfig C>
  static constexpr Holds all(const C& c) {
    return {c.layers, true, true};
  }
  // Pipe rank r of pipeline::Partition::even (layers divisible by pipe x virtual stages): its
  // share of the blocks, the embedding on rank 0, the head on the last.
  template <nn::ModelConfig C>
  static constexpr Holds even(const C& c, int pipe, int r) {
    return {c.layers / pipe, r == 0, r == pipe - 1};
  }
  static Holds of(const nn::Parts& p) {
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

// A rank's parameter elements by unit, before padding (a model's units(config, spread) gives them).
struct Units {
  std::int64_t table = 0;      // the token embedding's table, (Vp/tp, C)
  std::int64_t positions = 0;  // learned positions (T, C), or 0
  std::int64_t block = 0;      // one block
  std::int64_t head = 0;       // the head's own parameters (its norm)

  constexpr std::int64_t embedding() const { return table + positions; }  // the unit when one rank holds both ends
};

// A model that gives its units' sizes at compile time: units(config, spread), found by ADL.
template <class C>
concept SizedUnits = requires(const C& c, const Spread& s) {
  { units(c, s) } -> std::same_as<Units>;
};

// The plan counts in 64 bits, so callers refuse configurations of more than about kMaxElements
// (petabytes) before planning them (a model's approximate_elements, found by ADL).
inline constexpr double kMaxElements = 1e15;

// n elements padded to a multiple of the data degree dp (optim/data_parallel.hpp's units).
constexpr std::int64_t padded(std::int64_t n, std::int64_t dp) { return (n + dp - 1) / dp * dp; }

// The persistent bytes of one rank holding `holds` of a tied model with units `u`, under
// data-parallel Strategy with update rule Rule (AdamW: 2 states), on the degrees of `s`.
template <class Strategy, PrecisionLike P, class Rule = optim::AdamW>
constexpr Memory persistent(const Units& u, const Spread& s, Holds holds) {
  using T = typename precision_t<P>::compute;
  using G = master_t<T>;
  using S = optim::state_t<T>;
  constexpr bool shard_params = IsShard<typename Strategy::params>;
  constexpr bool shard_grads = IsShard<typename Strategy::grads>;
  constexpr bool shard_state = IsShard<typename Strategy::state>;
  constexpr bool mixed = !std::same_as<T, G>;
  const std::int64_t dp = s.data_degree;
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

// The same for a model's configuration (Sizes must satisfy the model's validate()).
template <class Strategy, PrecisionLike P, class Rule = optim::AdamW, SizedUnits C>
constexpr Memory persistent(const C& c, const Spread& s, Holds holds) {
  return persistent<Strategy, P, Rule>(units(c, s), s, holds);
}

// Whether the persistent state fits `budget` bytes per rank; for static_assert:
//   static_assert(footprint::fits<optim::Fsdp, Bf16Mixed>(cfg, spread, footprint::Holds::all(cfg), 80LL << 30),
//                 "the model's state does not fit 80 GiB per GPU");
template <class Strategy, PrecisionLike P, class Rule = optim::AdamW, SizedUnits C>
constexpr bool fits(const C& c, const Spread& s, Holds holds, std::int64_t budget) {
  return persistent<Strategy, P, Rule>(c, s, holds).total() <= budget;
}

}  // namespace weft::footprint
