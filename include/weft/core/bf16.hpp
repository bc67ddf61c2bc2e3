// bf16: a 16-bit brain-float storage type usable on the host.
//
// Arithmetic happens in float: a bf16 converts to float exactly, and float -> bf16 rounds to the
// nearest even (NaN stays NaN, quiet). It is a storage type, not an arithmetic one, so it has no
// operators: code that sums bf16 values accumulates in float and rounds once at the end (the thread
// communicator's reductions do exactly that).
#pragma once

#include <bit>
#include <cstdint>

namespace weft {

struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  constexpr explicit bf16(float f) : bits(round(f)) {}
  constexpr explicit operator float() const { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 x;
    x.bits = b;
    return x;
  }
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }

 private:
  static constexpr std::uint16_t round(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)  // NaN: keep sign, force quiet
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    const std::uint32_t lsb = (u >> 16) & 1u;  // round half to even
    return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
  }
};

static_assert(sizeof(bf16) == 2);

}  // namespace weft
