// DiT's fixed embeddings (models/dit/embeddings.hpp): the 1D sin-cos values against their closed
// form, the 2D positions' layout (the column's half first) from sincos_1d, both against diffusers'
// functions (fixtures from tools/reference/dit_reference.py, record files), and bad sizes refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "weft/data/records.hpp"
#include "weft/models/dit/embeddings.hpp"

using namespace weft;

namespace {

std::vector<double> fixture(const std::string& name, std::vector<std::int64_t> dims) {
  const data::RecordFile f(std::string(WEFT_TEST_DATA_DIR) + "/" + name, {DType::f64, std::move(dims)});
  REQUIRE(f.size() == 1);
  std::vector<double> v(static_cast<std::size_t>(f.sample_elements()));
  const auto bytes = f.sample(0);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

double worst(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = test::worse(w, std::abs(a[i] - b[i]));
  return w;
}

}  // namespace

TEST_CASE("DiT's 1D sin-cos values are their closed form: [sin(p w_k) | cos(p w_k)], w_k = 10000^(-2k/d)") {
  const auto e = dit::sincos_1d(4, 1.0);
  REQUIRE(e.size() == 4);
  CHECK(e[0] == std::sin(1.0));
  CHECK(e[1] == doctest::Approx(std::sin(0.01)).epsilon(1e-15));
  CHECK(e[2] == std::cos(1.0));
  CHECK(e[3] == doctest::Approx(std::cos(0.01)).epsilon(1e-15));
  const auto zero = dit::sincos_1d(6, 0.0);  // position 0: sines 0, cosines 1
  CHECK(zero == std::vector<double>{0, 0, 0, 1, 1, 1});
}

TEST_CASE("DiT's 2D positions: the column's half, then the row's, and diffusers' table to rounding") {
  const auto pos = dit::sincos_2d(32, 4, 4);
  REQUIRE(pos.size() == 16 * 32);
  // Token (i, j) = (2, 3) is row 11: its first 16 values encode the column 3, the last 16 the row 2.
  const auto col = dit::sincos_1d(16, 3.0), row = dit::sincos_1d(16, 2.0);
  for (int k = 0; k < 16; ++k) {
    CHECK(pos[static_cast<std::size_t>(11 * 32 + k)] == col[static_cast<std::size_t>(k)]);
    CHECK(pos[static_cast<std::size_t>(11 * 32 + 16 + k)] == row[static_cast<std::size_t>(k)]);
  }
  // diffusers' get_2d_sincos_pos_embed in float64 over exact grid coordinates: the same sums of
  // the same terms, pow and sin in other libraries: 1e-14.
  const double e = worst(pos, fixture("dit_sincos_2d.bin", {16, 32}));
  CHECK(e <= 1e-14);
  MESSAGE("2D positions against diffusers: ", e);
}

TEST_CASE(
    "DiT's timestep features: flipped to [cos | sin] with the frequency shift, and diffusers' to float's rounding") {
  const std::vector<double> t{0.0, 1.0, 17.5, 250.0, 999.0};
  const auto f = dit::timestep_features(t, 256);
  REQUIRE(f.size() == 5 * 256);
  // t = 1, k = 1: frequency exp(-ln(10000) / 127); cosine first, then sine.
  const double w = std::exp(-std::log(10000.0) / 127.0);
  CHECK(f[256 + 1] == doctest::Approx(std::cos(w)).epsilon(1e-15));
  CHECK(f[256 + 128 + 1] == doctest::Approx(std::sin(w)).epsilon(1e-15));
  // diffusers computes the frequencies and the products in float32 (its choice, not the formula's):
  // arguments up to 999 off by float's 6e-8 relative move a sine or cosine by up to 6e-5.
  const double e = worst(f, fixture("dit_timesteps.bin", {5, 256}));
  CHECK(e <= 1e-4);
  MESSAGE("timestep features against diffusers (float32 there): ", e);
  // Unflipped, unshifted: [sin | cos] at frequencies exp(-ln(10000) k / 128).
  const auto g = dit::timestep_features(std::vector<double>{2.0}, 8, false, 0.0);
  CHECK(g[1] == doctest::Approx(std::sin(2.0 * std::exp(-std::log(10000.0) / 4.0))).epsilon(1e-15));
  CHECK(g[4] == 1.0 * std::cos(2.0));
}

TEST_CASE("DiT's embeddings refuse sizes they cannot lay out, naming them") {
  CHECK_THROWS_WITH_AS(dit::sincos_2d(30, 4, 4),
                       doctest::Contains("dit::sincos_2d: a width of 30 over a grid of 4 x 4"), Error);
  CHECK_THROWS_WITH_AS(dit::sincos_1d(3, 0.0), doctest::Contains("dit::sincos_1d: an embedding of 3 values"), Error);
  CHECK_THROWS_WITH_AS(dit::timestep_features(std::vector<double>{1.0}, 2), doctest::Contains("a width of 2"), Error);
}
