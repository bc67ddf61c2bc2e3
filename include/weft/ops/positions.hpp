// ops::Positions: the sequence position of each of a tensor's Tn rows (t = n % Tn of a (B, Tn, ...)
// activation), for the ops that depend on it (rotary angles, learned position embeddings).
//
// Two runs: p0 + t for the rows t < split, p1 + (t - split) from there on. One run (split past the
// rows, the default) is a whole sequence or a window of one starting at p0; two are a context
// rank's pair of chunks (context::Chunks::positions: rank r of c holds chunks r and 2c - 1 - r, of
// T / 2c tokens each). An index converts to the run that starts there.
//
// This header is plain C++20.
//
// defines: ops::Positions
#pragma once

#include <cstdint>
#include <limits>

namespace weft::ops {

struct Positions {
  std::int64_t p0 = 0, split = std::numeric_limits<std::int64_t>::max(), p1 = 0;

  constexpr Positions() = default;
  constexpr Positions(std::int64_t first) : p0(first) {}  // NOLINT(google-explicit-constructor): pos0 = first
  constexpr Positions(std::int64_t first, std::int64_t at, std::int64_t second) : p0(first), split(at), p1(second) {}

  constexpr std::int64_t at(std::int64_t t) const { return t < split ? p0 + t : p1 + (t - split); }
  // The positions of rows from, from + 1, ...: a slice of these rows (sequence parallelism's slice
  // of a context rank's rows).
  constexpr Positions from(std::int64_t first) const {
    if (first >= split) return Positions(p1 + (first - split));
    return {p0 + first, split - first, p1};
  }
  constexpr bool operator==(const Positions&) const = default;
};

}  // namespace weft::ops
