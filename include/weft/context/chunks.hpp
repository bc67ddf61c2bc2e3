// context::Chunks: which tokens of a sequence a rank of the context axis holds.
//
// The sequence of T tokens is cut into 2c equal chunks for c context ranks; rank r holds chunks r and
// 2c - 1 - r, in that order (its T / c local rows: the first half from chunk r, the second from
// chunk 2c - 1 - r). Under a causal mask a query at position p sees p + 1 keys, so an early chunk
// paired with its mirror gives every rank the same attention work: rank r's queries see
//   sum over its positions of (p + 1) = (T / 2c)^2 (2c) + T / 2c       (the same for every r)
// keys in all (the load balance Megatron-Core and Llama 3 use). Positions (learned or rotary)
// follow the chunks: a rank's local row t is the token at position(rank, t).
//
// This header is plain C++20.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "weft/core/divisors.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/positions.hpp"

namespace weft::context {

using index = std::int64_t;

struct Chunks {
  index seq = 0;   // T, the whole sequence
  int degree = 1;  // c, the context ranks

  // The chunks of a sequence of `seq` tokens over `degree` ranks; refused, naming both, unless the
  // 2c chunks are equal and not empty.
  static Chunks of(index seq, int degree) {
    if (degree < 1) throw Error("context::Chunks", cat("a context degree of ", degree), "use a degree of 1 or more");
    if (seq <= 0 || seq % (2 * static_cast<index>(degree)) != 0)
      throw Error("context::Chunks",
                  cat("a sequence of ", seq, " tokens does not split into 2 x ", degree, " = ", 2 * degree,
                      " equal chunks (each context rank holds two)"),
                  cat("use a sequence length that is a multiple of ", 2 * degree, ", or another context degree"));
    return {seq, degree};
  }

  index chunk() const { return seq / (2 * static_cast<index>(degree)); }  // T / 2c tokens
  index local() const { return 2 * chunk(); }                             // T / c rows per rank

  // The position in the sequence of rank `rank`'s local row t (0 <= t < local()).
  index position(int rank, index t) const {
    const index h = chunk();
    return t < h ? static_cast<index>(rank) * h + t : (2 * static_cast<index>(degree) - 1 - rank) * h + (t - h);
  }
  // Rank `rank`'s rows of a (B, T) array (tokens, targets): (B, T / c), each sequence's local rows in
  // order. The model's first and last stages take them from the whole sequences every context rank
  // of a data rank reads (the loader is the same as without context parallelism).
  template <class V>
  std::vector<V> rows(std::span<const V> all, int rank) const {
    if (static_cast<index>(all.size()) % seq != 0)
      throw Error("context::Chunks::rows", cat(all.size(), " values are not whole sequences of ", seq),
                  "pass (batch, seq) tokens or targets");
    const index B = static_cast<index>(all.size()) / seq, Tl = local();
    std::vector<V> out(static_cast<std::size_t>(B * Tl));
    for (index b = 0; b < B; ++b)
      for (index t = 0; t < Tl; ++t)
        out[static_cast<std::size_t>(b * Tl + t)] = all[static_cast<std::size_t>(b * seq + position(rank, t))];
    return out;
  }

  // The same as the two runs of positions that rotary and learned position embeddings take.
  ops::Positions positions(int rank) const {
    const index h = chunk();
    return {static_cast<index>(rank) * h, h, (2 * static_cast<index>(degree) - 1 - rank) * h};
  }
};

// Sequence parallelism inside context parallelism splits each context rank's T / c rows over its
// tensor group: refused, naming the model and the values, unless the tensor degree divides them
// (a sequence that 2c does not divide is Chunks::of's refusal, not this one).
inline void require_tensor_split(const char* model, index seq, int context, int tensor) {
  if (context <= 1 || seq % (2 * static_cast<index>(context)) != 0 || (seq / context) % tensor == 0) return;
  const index rows = seq / context;
  throw Error(
      model,
      cat("sequence parallelism inside context parallelism needs the tensor degree ", tensor,
          " to divide each context rank's ", rows, " rows (a sequence of ", seq, " over ", context, " context ranks)"),
      cat("use a tensor degree that divides ", rows, ", such as ", list_divisors(rows, tensor),
          ", or a longer sequence"));
}

}  // namespace weft::context
