// ops::ScaledGemm on the GPU (ops/scaled_gemm.cuh) against the host's (ops/scaled_gemm.hpp, which
// tests/ops/scaled_gemm.cpp holds to torch._scaled_mm): the amaxes and the float8 bytes of every
// recipe's casts equal the host's exactly (the same conversion, the same scales), transposed reads
// included; the GEMMs of a linear layer (forward, dgrad, wgrad accumulating into f32) equal the
// host's within the sum order's rounding: 2e-5 of the largest output in f32 without fast
// accumulation (a few hundred f32 additions of exact products, in another order), 1e-2 where the
// output is bf16 (one rounding to 8 bits) or the forward's fast accumulation keeps fewer bits of
// the partial sums. An infinite operand is refused by the operand's name, as on the host.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support.cuh"
#include "weft/core/float8_gemms.hpp"
#include "weft/ops/scaled_gemm.cuh"

using namespace weft;
using namespace weft::test;

namespace {

template <class T>
std::vector<float> as_rows(const std::vector<T>& x, bool trans, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return host::rows_of(x.data(), trans ? Trans::yes : Trans::no, rows, cols, ld);
}

// The GPU's amaxes and casts of op(X) (rows, K) against fp8::block_amaxes and fp8::cast_blocks.
template <class F8, class T>
void check_cast(Cuda& d, bool trans, std::int64_t rows, std::int64_t K, std::int64_t br, std::int64_t bc, bool pow2) {
  CAPTURE(trans);
  CAPTURE(br);
  CAPTURE(bc);
  const std::int64_t ld = trans ? rows : K;
  const auto x = random<T>(static_cast<std::size_t>(rows * K), 7, 3.0);
  DeviceVec<T> gx(d, x);
  const std::vector<float> host_rows = as_rows(x, trans, rows, K, ld);
  const std::vector<float> want = fp8::block_amaxes<float>(host_rows, rows, K, br, bc);
  const std::vector<float> got = weft::cuda::fp8_amaxes(d, gx.data(), trans, rows, K, ld, br, bc);
  CHECK(got == want);
  const auto s = fp8::block_scales<F8>(want, rows, K, br, bc, pow2, "test");
  const auto ref = fp8::cast_blocks<F8>(host_rows, rows, K, br, bc, want, pow2, "test");
  DeviceVec<float> scale(d, s.scale);
  const std::int64_t ldq = (K + 15) / 16 * 16;
  DeviceVec<std::uint8_t> q(d, static_cast<std::size_t>(rows * ldq));
  weft::cuda::fp8_cast<F8>(d, gx.data(), trans, rows, K, ld, br, bc, scale.data(), q.data(), ldq);
  const std::vector<std::uint8_t> bytes = q.get(d);
  std::int64_t differ = 0, padding = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < ldq; ++c) {
      const std::uint8_t b = bytes[static_cast<std::size_t>(r * ldq + c)];
      if (c >= K) padding += b != 0;
      else differ += b != ref.q[static_cast<std::size_t>(r * K + c)].bits;
    }
  CHECK(differ == 0);
  CHECK(padding == 0);
}

// One GEMM of a linear layer through both devices: C = op(A) op(B) (+ C0 where beta is 1).
template <class G, fp8::Operand ra, fp8::Operand rb, class T, class C>
void check_gemm(Cuda& d, Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float beta) {
  CAPTURE(G::name());
  CAPTURE(static_cast<int>(ra));
  CAPTURE(static_cast<int>(rb));
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  const std::int64_t lda = ta == Trans::yes ? m : k, ldb = tb == Trans::yes ? k : n;
  const auto A = random<T>(static_cast<std::size_t>(m * k), 1, 2.0);
  const auto B = random<T>(static_cast<std::size_t>(k * n), 2, 0.05);
  const auto C0 = random<C>(static_cast<std::size_t>(m * n), 3);
  std::vector<C> want = C0;
  std::vector<float> host_a, host_b, gpu_a, gpu_b;
  Host h;
  ops::ScaledGemm<Host>::run<G, ra, rb>(
      h, ta, tb, m, n, k, 1.0f, A.data(), lda, B.data(), ldb, beta, want.data(), n, "test",
      [&](std::span<float> a) { host_a.assign(a.begin(), a.end()); },
      [&](std::span<float> b) { host_b.assign(b.begin(), b.end()); });
  DeviceVec<T> gA(d, A), gB(d, B);
  DeviceVec<C> gC(d, C0);
  ops::ScaledGemm<Cuda>::run<G, ra, rb>(
      d, ta, tb, m, n, k, 1.0f, gA.data(), lda, gB.data(), ldb, beta, gC.data(), n, "test",
      [&](std::span<float> a) { gpu_a.assign(a.begin(), a.end()); },
      [&](std::span<float> b) { gpu_b.assign(b.begin(), b.end()); });
  CHECK(gpu_a == host_a);  // the hooks see the same amaxes
  CHECK(gpu_b == host_b);
  constexpr bool fast = ra == fp8::Operand::activation && rb == fp8::Operand::weight;
  const double tol = std::same_as<C, float> && !fast ? 2e-5 : 1e-2;
  CHECK(rel_error(gC.get(d), widen(want)) <= tol);
}

template <class G, class T>
void check_layer(Cuda& d) {
  using fp8::Operand;
  const std::int64_t N = 256, in = 384, out = 128;  // tokens, features: multiples of 128 for blockwise
  // forward y (N, out) = x (N, in) W^T; dgrad dx (N, in) = dy (N, out) W; wgrad dW (out, in) += dy^T x
  check_gemm<G, Operand::activation, Operand::weight, T, T>(d, Trans::no, Trans::yes, N, out, in, 0.0f);
  check_gemm<G, Operand::gradient, Operand::weight, T, T>(d, Trans::no, Trans::no, N, in, out, 0.0f);
  check_gemm<G, Operand::gradient, Operand::activation, T, float>(d, Trans::yes, Trans::no, out, in, N, 1.0f);
}

}  // namespace

TEST_CASE_TEMPLATE("FP8 casts on the GPU give the host's amaxes and float8 bytes", T, float, bf16) {
  Cuda& d = gpu();
  for (bool trans : {false, true}) {
    check_cast<float8_e4m3, T>(d, trans, 96, 256, 96, 256, false);    // tensorwise
    check_cast<float8_e4m3, T>(d, trans, 96, 256, 1, 256, true);      // rowwise, power-of-two scales
    check_cast<float8_e5m2, T>(d, trans, 96, 256, 1, 256, true);      // rowwise gradients
    check_cast<float8_e4m3, T>(d, trans, 256, 256, 128, 128, false);  // blockwise weights
    check_cast<float8_e5m2, T>(d, trans, 96, 256, 1, 128, false);     // blockwise gradients
    check_cast<float8_e4m3, T>(d, trans, 24, 40, 24, 40, false);      // rows padded from 40 to 48 bytes
  }
}

TEST_CASE_TEMPLATE("FP8 GEMMs on the GPU equal the host's for every recipe", T, float, bf16) {
  Cuda& d = gpu();
  check_layer<fp8::Gemms<fp8::scaling::Tensorwise>, T>(d);
  check_layer<fp8::Gemms<fp8::scaling::Rowwise>, T>(d);
  check_layer<fp8::Gemms<fp8::scaling::Rowwise, float8_e4m3>, T>(d);
  check_layer<fp8::Gemms<fp8::scaling::Blockwise<128>>, T>(d);
}

TEST_CASE("an FP8 operand that overflows on the GPU is refused by its name") {
  Cuda& d = gpu();
  std::vector<float> x(64 * 32, 1.0f), w(16 * 32, 0.5f), y(64 * 16);
  x[77] = std::numeric_limits<float>::infinity();
  DeviceVec<float> gx(d, x), gw(d, w), gy(d, y.size());
  using G = fp8::Gemms<fp8::scaling::Rowwise>;
  CHECK_THROWS_WITH_AS((ops::ScaledGemm<Cuda>::run<G, fp8::Operand::activation, fp8::Operand::weight>(
                           d, Trans::no, Trans::yes, 64, 16, 32, 1.0f, gx.data(), 32, gw.data(), 32, 0.0f, gy.data(),
                           16, "the layer's forward GEMM")),
                       doctest::Contains("the layer's forward GEMM, its input: row 2 holds an infinite or NaN value"),
                       Error);
}
