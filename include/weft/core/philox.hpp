// Philox-4x32-10, the counter-based random number generator of Salmon et al., SC'11 (Random123).
//
// A value depends only on (seed, stream, counter): there is no state to carry, split or
// synchronize, so rank r can draw element i of a parameter without drawing elements 0..i-1, and the
// same seed gives the same global weights on any mesh. The mapping used throughout weft:
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (counter low, counter high, stream low, stream high)
// Each (seed, stream, counter) yields four 32-bit words. The raw bijection philox4x32() is checked
// against the published Random123 known-answer vectors.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace weft {

using Philox4x32 = std::array<std::uint32_t, 4>;

// The raw Philox-4x32-10 bijection: 10 rounds over ctr with key (k0, k1).
constexpr Philox4x32 philox4x32(Philox4x32 ctr, std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;  // round multipliers
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += w0;
      key[1] += w1;
    }
    const std::uint64_t p0 = std::uint64_t{m0} * ctr[0];
    const std::uint64_t p1 = std::uint64_t{m1} * ctr[2];
    ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
  }
  return ctr;
}

// Four words for (seed, stream, counter).
constexpr Philox4x32 philox(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  return philox4x32({static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32),
                     static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

// Uniform in [0, 1) from the top 24 (float) or 53 (double) bits.
constexpr float uniform_f32(std::uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }
constexpr double uniform_f64(std::uint32_t hi, std::uint32_t lo) {
  return static_cast<double>(((std::uint64_t{hi} << 32) | lo) >> 11) * 0x1.0p-53;
}

// A standard normal for (seed, stream, index): Box-Muller on the first two words of counter index/2
// (double precision throughout, so f32 and f64 initializations draw the same underlying value).
inline double normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const Philox4x32 w = philox(seed, stream, index / 2);
  const double u1 = 1.0 - uniform_f64(w[0], w[1]);  // (0, 1]: log stays finite
  const double u2 = uniform_f64(w[2], w[3]);
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 2.0 * std::numbers::pi * u2;
  return (index % 2 == 0) ? r * std::cos(a) : r * std::sin(a);
}

// A uniform [0, 1) double for (seed, stream, index): two words of counter index/2.
constexpr double uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const Philox4x32 w = philox(seed, stream, index / 2);
  return index % 2 == 0 ? uniform_f64(w[0], w[1]) : uniform_f64(w[2], w[3]);
}

}  // namespace weft
