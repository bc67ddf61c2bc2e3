// float8_e4m3 and float8_e5m2 (core/float8.hpp) against PyTorch's casts to torch.float8_e4m3fn and
// torch.float8_e5m2 (tests/fixtures/float8/casts.bin, from tools/reference/float8_casts.py, whose
// docstring gives the inputs and the layout): every bf16 bit pattern cast byte for byte, every one of
// the 256 bytes of each format decoded to the same float32 bits (NaN's payload aside), and 10^6
// float32 bit patterns cast to the same bytes (per 1000 values, by their FNV-1a hash); the decode
// exact (each float8 value casts back to its own byte); the scale rule against its closed form.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/float8.hpp"

using namespace weft;

namespace {

std::vector<std::uint8_t> fixture() {
  const std::string path = std::string(WEFT_TEST_DATA_DIR) + "/float8/casts.bin";
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open ", path);
  std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(b.size() == 8 + 2 * 65536 + 2 * 256 * 4 + 2 * 1000 * 8 + 3 * 4);
  REQUIRE(std::memcmp(b.data(), "WEFTFP8\x01", 8) == 0);
  return b;
}

template <class T>
T at(const std::vector<std::uint8_t>& b, std::size_t offset) {
  T v;
  std::memcpy(&v, b.data() + offset, sizeof(T));
  return v;
}

std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The fixture's input B[i] (tools/reference/float8_casts.py's random_patterns).
std::uint32_t pattern(std::uint64_t i) {
  const auto bits = static_cast<std::uint32_t>(splitmix64(0x5EEDull + i) >> 32);
  if (i % 2 == 1) return bits;
  const std::uint32_t field = (bits >> 23) & 0xffu;
  return (bits & 0x807fffffu) | ((107u + field % 41u) << 23);
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

std::uint64_t fnv1a(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

template <class F8>
void against_pytorch(const std::vector<std::uint8_t>& b, int which, const char* name) {
  INFO(name);
  // A: every bf16 bit pattern.
  int wrong = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const std::uint8_t want = b[8 + static_cast<std::size_t>(which) * 65536 + p];
    const std::uint8_t got = F8(std::bit_cast<float>(p << 16)).bits;
    if (got != want && ++wrong <= 5) FAIL_CHECK("bf16 ", hex(p), ": ", hex(got), ", PyTorch's ", hex(want));
  }
  CHECK(wrong == 0);
  // Every byte decoded: the same float32 (every NaN a NaN of the same sign), and cast back to itself.
  for (int c = 0; c < 256; ++c) {
    const auto want = at<float>(b, 8 + 2 * 65536 + static_cast<std::size_t>(which) * 1024 + 4 * c);
    const F8 x = F8::from_bits(static_cast<std::uint8_t>(c));
    const auto got = static_cast<float>(x);
    INFO("byte ", hex(static_cast<std::uint32_t>(c)));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      CHECK(x.is_nan());
      CHECK(std::signbit(got) == std::signbit(want));
    } else {
      CHECK(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want));
      CHECK(!x.is_nan());
      CHECK(F8(got).bits == c);
    }
  }
  // B: 10^6 float32 patterns, 1000 at a time.
  std::array<std::uint8_t, 1000> out{};
  int chunks = 0;
  for (std::uint64_t c = 0; c < 1000; ++c) {
    for (std::uint64_t i = 0; i < 1000; ++i) out[i] = F8(std::bit_cast<float>(pattern(c * 1000 + i))).bits;
    const auto want = at<std::uint64_t>(b, 8 + 2 * 65536 + 2048 + static_cast<std::size_t>(which) * 8000 + 8 * c);
    if (fnv1a(out.data(), out.size()) != want && ++chunks <= 3) FAIL_CHECK("values ", c * 1000, " to ", c * 1000 + 999);
  }
  CHECK(chunks == 0);
}

}  // namespace

TEST_CASE("float8_e4m3 casts as PyTorch's float8_e4m3fn: every bf16 pattern, every byte, 10^6 float32 values") {
  against_pytorch<float8_e4m3>(fixture(), 0, "e4m3");
}

TEST_CASE("float8_e5m2 casts as PyTorch's float8_e5m2: every bf16 pattern, every byte, 10^6 float32 values") {
  against_pytorch<float8_e5m2>(fixture(), 1, "e5m2");
}

TEST_CASE("float8: the rules by hand, and the fixture's mix of inputs") {
  // Ties to even at the subnormals' edge: 2^-10 is half e4m3's smallest subnormal (to 0), 1.5 2^-10
  // above it (to 2^-9).
  CHECK(float8_e4m3(std::ldexp(1.0f, -10)).bits == 0x00);
  CHECK(float8_e4m3(1.5f * std::ldexp(1.0f, -10)).bits == 0x01);
  // e4m3 saturates, e5m2 rounds to infinity from the midpoint past its largest value.
  CHECK(float8_e4m3(1e30f).bits == 0x7e);
  CHECK(float8_e4m3(-INFINITY).bits == 0xfe);
  CHECK(float8_e5m2(61439.0f).bits == 0x7b);
  CHECK(float8_e5m2(61440.0f).bits == 0x7c);
  CHECK(float8_e4m3(-NAN).bits == 0xff);
  // The fixture's B holds what its docstring says: NaNs, e5m2 infinities (past 57344) in numbers.
  const auto b = fixture();
  const std::size_t counts = b.size() - 12;
  std::uint32_t nan4 = 0, nan5 = 0, inf5 = 0;
  for (std::uint64_t i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(pattern(i));
    nan4 += float8_e4m3(f).is_nan();
    const float8_e5m2 y(f);
    nan5 += y.is_nan();
    inf5 += std::isinf(static_cast<float>(y));
  }
  CHECK(nan4 == at<std::uint32_t>(b, counts));
  CHECK(nan5 == at<std::uint32_t>(b, counts + 4));
  CHECK(inf5 == at<std::uint32_t>(b, counts + 8));
  MESSAGE("of the 10^6 values: ", nan4, " NaNs, ", inf5, " past e5m2's largest value");
}

TEST_CASE("float8_scale: the largest magnitude to the format's largest value, 1 for 0, powers of two") {
  CHECK(float8_scale<float8_e4m3>(448.0) == 1.0f);
  CHECK(float8_scale<float8_e4m3>(1.0) == 448.0f);
  CHECK(float8_scale<float8_e5m2>(1.0) == 57344.0f);
  CHECK(float8_scale<float8_e4m3>(3.0) == static_cast<float>(448.0 / 3.0));
  CHECK(float8_scale<float8_e4m3>(3.0, true) == 128.0f);  // 149.33 rounded down to a power of two
  CHECK(float8_scale<float8_e4m3>(0.0) == 1.0f);
  CHECK(float8_scale<float8_e4m3>(1e-30) == static_cast<float>(448.0 / 1e-12));  // amax clamped to eps
  CHECK_THROWS_WITH_AS(float8_scale<float8_e4m3>(INFINITY), doctest::Contains("float8_scale: an amax of inf"), Error);
  CHECK_THROWS_WITH_AS(float8_scale<float8_e5m2>(-1.0), doctest::Contains("an amax of -1"), Error);
}
