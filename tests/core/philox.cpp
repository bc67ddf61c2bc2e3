#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "weft/core/philox.hpp"

// Known-answer vectors for philox4x32 with 10 rounds, from Random123's kat_vectors file
// (columns: counter (4 words), key (2 words), expected output (4 words)).
TEST_CASE("Philox-4x32-10 matches the Random123 known-answer vectors") {
  CHECK(weft::philox4x32({0, 0, 0, 0}, {0, 0}) == weft::Philox4x32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(weft::philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        weft::Philox4x32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(weft::philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        weft::Philox4x32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  // It is constexpr: the same vector at compile time.
  static_assert(weft::philox4x32({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5);
}

TEST_CASE("philox(seed stream counter) maps onto the raw bijection") {
  const std::uint64_t seed = 0x299f31d0a4093822ull, stream = 0x037073441319'8a2eull, ctr = 0x85a308d3243f6a88ull;
  CHECK(weft::philox(seed, stream, ctr) == weft::Philox4x32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  // A value depends on each of the three and nothing else.
  CHECK(weft::philox(1, 2, 3) == weft::philox(1, 2, 3));
  CHECK(weft::philox(1, 2, 3) != weft::philox(2, 2, 3));
  CHECK(weft::philox(1, 2, 3) != weft::philox(1, 3, 3));
  CHECK(weft::philox(1, 2, 3) != weft::philox(1, 2, 4));
}

TEST_CASE("uniform and normal draws have the right moments") {
  // 200k samples: the standard error of the mean is 1/sqrt(12 * 2e5) ~ 6.5e-4 for the uniform and
  // 2.2e-3 for the normal; the bounds below are about 5 standard errors.
  constexpr int n = 200'000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0, sn4 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = weft::uniform(42, 7, static_cast<std::uint64_t>(i));
    CHECK_MESSAGE((u >= 0.0 && u < 1.0), "uniform out of [0, 1): ", u);
    su += u;
    su2 += u * u;
    const double z = weft::normal(42, 7, static_cast<std::uint64_t>(i));
    sn += z;
    sn2 += z * z;
    sn4 += z * z * z * z;
  }
  CHECK(std::fabs(su / n - 0.5) < 3.5e-3);
  CHECK(std::fabs(su2 / n - 1.0 / 3.0) < 3.5e-3);
  CHECK(std::fabs(sn / n) < 1.2e-2);
  CHECK(std::fabs(sn2 / n - 1.0) < 1.6e-2);
  CHECK(std::fabs(sn4 / n - 3.0) < 0.12);  // fourth moment of N(0, 1); sd of the estimate ~ 0.022
}

TEST_CASE("uniform_f32 covers the unit interval with 24 bits") {
  CHECK(weft::uniform_f32(0) == 0.0f);
  CHECK(weft::uniform_f32(0xffffffffu) == 1.0f - 0x1.0p-24f);
  CHECK(weft::uniform_f64(0xffffffffu, 0xffffffffu) == 1.0 - 0x1.0p-53);
}
