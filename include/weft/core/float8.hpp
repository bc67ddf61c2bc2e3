// float8_e4m3 and float8_e5m2: the two 8-bit floating-point storage types of FP8 training (Micikevicius
// et al. 2022), with PyTorch's conversions (torch.float8_e4m3fn and torch.float8_e5m2, their CPU
// casts), byte for byte:
//
//   format   sign exponent mantissa  bias  largest finite  smallest subnormal  inf    NaN
//   e4m3     1    4        3         7     448 (0x7e)      2^-9                none   S.1111.111
//   e5m2     1    5        2         15    57344 (0x7b)    2^-16               S.11111.00  S.11111.xx
//
// float -> float8 rounds to the nearest, ties to even, through the subnormals. A NaN becomes the
// format's NaN with the input's sign (0x7f or 0xff). Past the largest finite value, e4m3 saturates
// (every value and infinity beyond 448 becomes +-448, as PyTorch's e4m3fn cast does) and e5m2 rounds
// to infinity as IEEE formats do (from 61440, the midpoint past 57344, on). float8 -> float is exact.
// Storage types, not arithmetic ones, as bf16 is (core/bf16.hpp).
//
// The scale of a tensor with largest magnitude amax (the scaling recipes' rule: Transformer Engine's
// and torchao's): scale = max / max(amax, eps) in double, rounded to float, so that amax maps to
// the format's largest value; 1 where amax is 0 (nothing to scale); with pow2, rounded down to a
// power of two (multiplying by it is then exact). amax must be finite and not negative.
//
// tests/core/float8.cpp holds the casts to PyTorch's over every bf16 bit pattern and 10^6 float32
// values (tests/fixtures/float8, from tools/reference/float8_casts.py).
//
// defines: weft::float8_e4m3, weft::float8_e5m2, weft::Float8, weft::float8_scale
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>

#include "weft/core/error.hpp"

namespace weft {

namespace detail {

// An 8-bit format of E exponent and M mantissa bits. Finite: whether it has no infinities (e4m3:
// its top exponent holds numbers, all but S.1111.111).
template <int E, int M, bool Finite>
struct Float8Format {
  static constexpr int bias = (1 << (E - 1)) - 1;
  static constexpr std::uint8_t nan = 0x7f;                                               // with the sign bit clear
  static constexpr std::uint8_t inf = Finite ? 0 : static_cast<std::uint8_t>(0x1f << M);  // e5m2: 0x7c
  static constexpr std::uint8_t max_code = Finite ? 0x7e : static_cast<std::uint8_t>((0x1f << M) - 1);

  static constexpr bool is_nan(std::uint8_t b) {
    const std::uint8_t a = b & 0x7f;
    return Finite ? a == 0x7f : a > inf;
  }

  // float -> this format: round to nearest even; NaN keeps its sign; past the largest finite value,
  // saturate (Finite) or infinity.
  static constexpr std::uint8_t encode(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | nan;
    const std::uint8_t overflow = Finite ? max_code : inf;
    if (a == 0x7f800000u) return sign | overflow;
    const int e = static_cast<int>(a >> 23);
    const std::uint32_t full = e == 0 ? (a & 0x7fffffu) : ((a & 0x7fffffu) | 0x800000u);  // f32 subnormal: no 1.
    const int ee = e == 0 ? 1 : e;                                                        // its exponent field's value
    const int te = ee - 127 + bias;
    std::uint32_t v = 0;
    if (te >= 1) {  // a normal number of the format, or past it: (te, mantissa) with the rest rounded
      const int shift = 23 - M;
      const std::uint32_t rest = full & ((1u << shift) - 1u), half = 1u << (shift - 1);
      if (te > 0xff) return sign | overflow;
      v = (static_cast<std::uint32_t>(te) << M) | ((full >> shift) & ((1u << M) - 1u));
      if (rest > half || (rest == half && (v & 1u))) ++v;  // a carry moves into the exponent
    } else {                                               // the format's subnormals: units of 2^(1 - bias - M)
      const int shift = 151 - bias - M - ee;
      if (shift > 25) return sign;  // under a quarter of the smallest subnormal
      const std::uint32_t rest = full & ((1u << shift) - 1u), half = 1u << (shift - 1);
      v = full >> shift;
      if (rest > half || (rest == half && (v & 1u))) ++v;  // may become the smallest normal
    }
    if (v > max_code) return sign | overflow;
    return sign | static_cast<std::uint8_t>(v);
  }

  static constexpr float decode(std::uint8_t b) {
    const bool negative = (b & 0x80) != 0;
    const std::uint8_t a = b & 0x7f;
    if (is_nan(b)) return std::bit_cast<float>(0x7fc00000u | (negative ? 0x80000000u : 0u));
    if (!Finite && a == inf) return negative ? -std::bit_cast<float>(0x7f800000u) : std::bit_cast<float>(0x7f800000u);
    const int e = a >> M;
    const std::uint32_t m = a & ((1u << M) - 1u);
    std::uint32_t bits = 0;
    if (e == 0 && m != 0) {  // subnormal: m 2^(1 - bias - M), normalised into float32
      int shift = 0;
      while (!(m << shift & (1u << M))) ++shift;
      const std::uint32_t mm = (m << shift) & ((1u << M) - 1u);
      bits = static_cast<std::uint32_t>(1 - bias - shift + 127) << 23 | mm << (23 - M);
    } else if (e != 0) {
      bits = static_cast<std::uint32_t>(e - bias + 127) << 23 | m << (23 - M);
    }
    return std::bit_cast<float>(bits | (negative ? 0x80000000u : 0u));
  }
};

}  // namespace detail

// An 8-bit float of format F (detail::Float8Format), converted from and to float.
template <class F>
struct Float8 {
  using format = F;
  std::uint8_t bits = 0;

  constexpr Float8() = default;
  constexpr explicit Float8(float f) : bits(F::encode(f)) {}
  constexpr explicit operator float() const { return F::decode(bits); }

  static constexpr Float8 from_bits(std::uint8_t b) {
    Float8 x;
    x.bits = b;
    return x;
  }
  // The largest finite value: 448 (e4m3), 57344 (e5m2).
  static constexpr float max() { return F::decode(F::max_code); }
  constexpr bool is_nan() const { return F::is_nan(bits); }
  friend constexpr bool operator==(Float8 a, Float8 b) { return a.bits == b.bits; }
};

using float8_e4m3 = Float8<detail::Float8Format<4, 3, true>>;   // torch.float8_e4m3fn
using float8_e5m2 = Float8<detail::Float8Format<5, 2, false>>;  // torch.float8_e5m2
static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
static_assert(float8_e4m3::max() == 448.0f && float8_e5m2::max() == 57344.0f);

// The recipes' scale for a tensor whose largest magnitude is amax (see the top of this file).
template <class F8>
float float8_scale(double amax, bool pow2 = false, double eps = 1e-12) {
  if (!(amax >= 0) || !std::isfinite(amax))
    throw Error("float8_scale", cat("an amax of ", amax),
                "scale a finite tensor (an infinite or NaN amax is an overflow upstream)");
  if (amax == 0) return 1.0f;
  const auto s = static_cast<float>(static_cast<double>(F8::max()) / std::max(amax, eps));
  if (!pow2) return s;
  return std::ldexp(1.0f, std::ilogb(s));  // s's power of two, rounded down
}

}  // namespace weft
