// FP8 current-scaling recipes and the scaled GEMM (core/float8_scaling.hpp) against PyTorch
// (tests/fixtures/float8/gemm.safetensors, from tools/reference/float8_gemm.py: torchao's recipes
// written out in torch, and torch._scaled_mm on the CPU): for tensorwise e4m3, rowwise e4m3 with
// power-of-two and with exact scales, and e5m2 x e4m3, the float8 bytes and the inverse scales of
// both operands exactly, and the GEMM within 1e-6 of the largest output (float32 sums in another
// order); the GEMM against the operands dequantized and multiplied in double; bad input refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "support/error.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/core/float8_scaling.hpp"

using namespace weft;

namespace {

const checkpoint::ImportDir& fixture() {
  static const checkpoint::ImportDir f(std::string(WEFT_TEST_DATA_DIR) + "/float8", "gemm", "float8 GEMM fixture");
  return f;
}

std::vector<float> floats(const std::string& name) {
  const auto v = fixture().read(name);  // F32, exact in double
  return {v.begin(), v.end()};
}

template <class F8>
void same_bytes(const fp8::Quantized<F8>& q, const std::string& name) {
  const auto want = fixture().read(name);
  REQUIRE(want.size() == q.q.size());
  int wrong = 0;
  for (std::size_t i = 0; i < want.size(); ++i) wrong += q.q[i].bits != static_cast<std::uint8_t>(want[i]);
  CHECK_MESSAGE(wrong == 0, name, ": ", wrong, " bytes differ");
}

template <class RX, class RW>
void against(const std::string& c) {
  INFO(c);
  const std::int64_t M = 8, N = 16, K = 64;
  const auto x = floats(c + ".x"), w = floats(c + ".w");
  const auto qx = fp8::quantize<RX>(x, M, K);
  const auto qw = fp8::quantize<RW>(w, N, K);
  same_bytes(qx, c + ".qx");
  same_bytes(qw, c + ".qw");
  CHECK(qx.inv == floats(c + ".inv_x"));  // exact: the same float operations
  CHECK(qw.inv == floats(c + ".inv_w"));
  const auto y = fp8::scaled_gemm(qx, qw), want = floats(c + ".y");
  const double e =
      test::rel_error(std::vector<double>(y.begin(), y.end()), std::vector<double>(want.begin(), want.end()));
  CHECK(e <= 1e-6);
  // The GEMM's definition in double: the dequantized operands' product.
  std::vector<double> exact(y.size());
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k)
        s += static_cast<double>(static_cast<float>(qx.q[static_cast<std::size_t>(m * K + k)])) *
             static_cast<float>(qw.q[static_cast<std::size_t>(n * K + k)]);
      exact[static_cast<std::size_t>(m * N + n)] = s * qx.inv[qx.inv.size() == 1 ? 0 : static_cast<std::size_t>(m)] *
                                                   qw.inv[qw.inv.size() == 1 ? 0 : static_cast<std::size_t>(n)];
    }
  const double ed = test::rel_error(std::vector<double>(y.begin(), y.end()), exact);
  CHECK(ed <= 1e-6);
  // And the whole point: near the float32 product of the operands themselves (e4m3 keeps 3 bits).
  std::vector<double> full(y.size());
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k)
        s += static_cast<double>(x[static_cast<std::size_t>(m * K + k)]) * w[static_cast<std::size_t>(n * K + k)];
      full[static_cast<std::size_t>(m * N + n)] = s;
    }
  const double eq = test::rel_error(std::vector<double>(y.begin(), y.end()), full);
  CHECK(eq <= 0.1);
  MESSAGE(c, ": bytes and scales exact; GEMM within ", e, " of torch._scaled_mm, ", ed,
          " of its definition in double; the quantization's own error ", eq);
}

}  // namespace

TEST_CASE("fp8 tensorwise, rowwise and e5m2 x e4m3: PyTorch's bytes and scales, torch._scaled_mm's GEMM") {
  against<fp8::Tensorwise<float8_e4m3>, fp8::Tensorwise<float8_e4m3>>("tensorwise");
  against<fp8::Rowwise<float8_e4m3>, fp8::Rowwise<float8_e4m3>>("rowwise");
  against<fp8::Rowwise<float8_e4m3, false>, fp8::Rowwise<float8_e4m3, false>>("rowwise_exact");
  against<fp8::Tensorwise<float8_e5m2>, fp8::Tensorwise<float8_e4m3>>("hybrid");
}

TEST_CASE("fp8 quantize: a zero row keeps scale 1, and an infinite value and mismatched shapes are refused by name") {
  const std::vector<float> x{0, 0, 0, 0, 1, -2, 0.5f, 3};
  const auto q = fp8::quantize<fp8::Rowwise<float8_e4m3>>(x, 2, 4);
  CHECK(q.inv == std::vector<float>{1.0f, 1.0f / 128.0f});  // 448 / 3 = 149.3, rounded down to 128
  CHECK(q.q[0].bits == 0);
  CHECK(static_cast<float>(q.q[7]) == 384.0f);  // 3 x 128, exact in e4m3
  const std::vector<float> bad{1, INFINITY};
  CHECK_THROWS_WITH_AS(fp8::quantize<fp8::Rowwise<float8_e4m3>>(bad, 1, 2),
                       doctest::Contains("fp8::quantize<rowwise>: row 0 holds an infinite or NaN value"), Error);
  CHECK_THROWS_WITH_AS(fp8::quantize<fp8::Tensorwise<float8_e4m3>>(x, 3, 4),
                       doctest::Contains("8 values for a (3, 4) operand"), Error);
  const auto a = fp8::quantize<fp8::Tensorwise<float8_e4m3>>(x, 2, 4);
  const auto b = fp8::quantize<fp8::Tensorwise<float8_e4m3>>(x, 4, 2);
  CHECK_THROWS_WITH_AS(fp8::scaled_gemm(a, b), doctest::Contains("operands (2, 4) and (4, 2)"), Error);
}

TEST_CASE("fp8 delayed scaling: Transformer Engine's history, reductions and margin, step by step") {
  // 6 steps of a (4, 64) tensor: the 3rd 50 times larger (cast with the earlier steps' scale, so
  // its values saturate), the 6th zeros (the scale stays). Each step's bytes, inverse scale and
  // saturated count, and the scale after its update, exactly.
  for (const auto& [how, reduce, margin] :
       {std::tuple{std::string("max"), fp8::AmaxReduction::max, 0},
        std::tuple{std::string("most_recent"), fp8::AmaxReduction::most_recent, 1}}) {
    INFO(how);
    fp8::DelayedScaler<float8_e4m3> scaler(4, reduce, margin);
    std::int64_t saturated = 0;
    for (int step = 0; step < 6; ++step) {
      INFO("step ", step);
      const std::string pre = cat("delayed_", how, ".", step);
      const auto q = scaler.quantize(floats(pre + ".x"), 4, 64);
      same_bytes(q, pre + ".q");
      CHECK(q.inv == floats(pre + ".inv"));
      CHECK(static_cast<double>(q.saturated) == fixture().read(pre + ".saturated")[0]);
      saturated += q.saturated;
      scaler.update();
      CHECK(scaler.scale() == floats(pre + ".scale")[0]);
    }
    CHECK(saturated > 0);  // the 3rd step's
    MESSAGE(how, ": 6 steps as Transformer Engine's; ", saturated, " values saturated at the 3rd; scale ",
            scaler.scale(), " at the end");
  }
  CHECK_THROWS_WITH_AS(fp8::DelayedScaler<float8_e4m3>(0), doctest::Contains("an amax history of 0 steps"), Error);
}

TEST_CASE("fp8 blockwise scaling: 1x128 activations, 128x128 weights, against dequantize-then-GEMM") {
  // DeepSeek-V3's blocks: x (8, 256) with a scale per row and 128 columns, w (128, 256) per 128x128
  // tile; each block's bytes and inverse scale exactly as PyTorch's, and the GEMM (each K block
  // summed apart, times its two scales) within 1e-6 of the dequantized operands' float32 product.
  const auto x = floats("blockwise.x"), w = floats("blockwise.w");
  const auto qx = fp8::quantize_blocks<float8_e4m3>(x, 8, 256, 1, 128);
  const auto qw = fp8::quantize_blocks<float8_e4m3>(w, 128, 256, 128, 128);
  same_bytes(qx, "blockwise.qx");
  same_bytes(qw, "blockwise.qw");
  CHECK(qx.inv == floats("blockwise.inv_x"));
  CHECK(qw.inv == floats("blockwise.inv_w"));
  const auto y = fp8::scaled_gemm(qx, qw), want = floats("blockwise.y");
  const double e =
      test::rel_error(std::vector<double>(y.begin(), y.end()), std::vector<double>(want.begin(), want.end()));
  CHECK(e <= 1e-6);  // float32 sums in another order
  MESSAGE("blockwise: bytes and scales exact, GEMM within ", e, " of the dequantized product");
  // A block that does not tile the operand, and operands whose K blocks disagree, refused by name.
  CHECK_THROWS_WITH_AS(fp8::quantize_blocks<float8_e4m3>(x, 8, 256, 1, 96),
                       doctest::Contains("blocks of 1x96 over a (8, 256) operand"), Error);
  const auto other = fp8::quantize_blocks<float8_e4m3>(w, 128, 256, 128, 256);
  const auto odd = fp8::quantize_blocks<float8_e4m3>(x, 8, 256, 1, 256);
  CHECK_NOTHROW((void)fp8::scaled_gemm(odd, other));
  const std::vector<float> z(8 * 384, 1.0f), zw(128 * 384, 1.0f);
  CHECK_THROWS_WITH_AS(fp8::scaled_gemm(fp8::quantize_blocks<float8_e4m3>(z, 8, 384, 1, 128),
                                        fp8::quantize_blocks<float8_e4m3>(zw, 128, 384, 128, 192)),
                       doctest::Contains("scale blocks of 128 and 192 along K = 384"), Error);
}
