#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "weft/core/bf16.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"

using weft::bf16;

TEST_CASE("bf16 round trip is exact for values with 8 significant bits") {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 0x1.fep127f, 0x1.0p-126f, 256.0f, -65280.0f}) {
    const float r = static_cast<float>(bf16(f));
    CHECK(r == f);
    CHECK(std::signbit(r) == std::signbit(f));
  }
}

TEST_CASE("bf16 rounds to nearest ties to even against the closed form") {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: the tie goes to the even mantissa (1).
  CHECK(static_cast<float>(bf16(1.0f + 0x1.0p-8f)) == 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
  CHECK(static_cast<float>(bf16(1.0f + 3 * 0x1.0p-8f)) == 1.0f + 0x1.0p-6f);
  // Just above the tie rounds up.
  CHECK(static_cast<float>(bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f)) == 1.0f + 0x1.0p-7f);
  // bf16 keeps 8 significant bits: rounding to nearest errs by at most half a unit in the last
  // place, 2^-8 relative, for normal numbers.
  for (int i = 1; i < 2000; ++i) {
    const float f = 1.0f + static_cast<float>(i) * 0.000731f;
    const float r = static_cast<float>(bf16(f));
    CHECK(std::fabs(r - f) <= std::ldexp(f, -8));
  }
}

TEST_CASE("bf16 keeps infinities and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(static_cast<float>(bf16(inf)) == inf);
  CHECK(static_cast<float>(bf16(-inf)) == -inf);
  CHECK(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits only in the low 16 bits must not round to infinity.
  CHECK(std::isnan(static_cast<float>(bf16(std::bit_cast<float>(0x7f800001u)))));
  // The largest finite float rounds to infinity in bf16 (it is above the largest bf16 + half ulp).
  CHECK(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::max()))));
}

TEST_CASE("dtype traits") {
  static_assert(weft::dtype_of<float> == weft::DType::f32);
  static_assert(weft::dtype_of<bf16> == weft::DType::bf16);
  static_assert(weft::size_of(weft::DType::bf16) == 2);
  static_assert(std::is_same_v<weft::accumulate_t<bf16>, float>);
  static_assert(weft::Element<std::int64_t> && !weft::Element<char>);
  CHECK(weft::cat(weft::DType::i64) == "i64");
}
