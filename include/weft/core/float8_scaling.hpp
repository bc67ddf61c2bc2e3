// FP8 scaling recipes with current scaling, and the scaled GEMM they feed, on the host: how a
// float tensor becomes float8 values and the scales that undo them (issue 55; docs/precision.md).
//
//   recipe                 scales of a (rows, cols) operand          as torchao's
//   fp8::Tensorwise<F8>    one: F8's largest / amax(all)             Float8LinearRecipeName.TENSORWISE
//   fp8::Rowwise<F8, P2>   one a row: F8's largest / amax(row)       ROWWISE (P2: scales rounded down to
//                          (each row a GEMM's reduction dim: x's     powers of two, as torchao's default)
//                          rows, and the weight's (N, K) rows)
//
// quantize<R>(x, rows, cols): q = float8(x * scale) (the product in float, then the cast, which
// saturates e4m3 at +-448), with the inverse scales 1 / scale (float) that a GEMM applies:
//
//   scaled_gemm(a (M, K), b (N, K)) = y (M, N),  y[m, n] = (sum_k a.q[m, k] b.q[n, k]) a.inv[m] b.inv[n]
//
// (a.inv, b.inv one value for tensorwise), the products and the sum in float, as
// torch._scaled_mm(a.q, b.q^T, scale_a = a.inv, scale_b = b.inv^T) computes on the CPU. The scale
// of each row or tensor is float8_scale's (core/float8.hpp: amax clamped to 1e-12, 1 for a zero
// amax). tests/core/float8_scaling.cpp holds the quantized bytes to torchao's recipe run in PyTorch
// exactly, and the GEMM to torch._scaled_mm within 1e-6 (tests/fixtures/float8/gemm.bin).
//
// defines: fp8::Tensorwise, fp8::Rowwise, fp8::Recipe, fp8::Quantized, fp8::quantize, fp8::scaled_gemm
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/float8.hpp"

namespace weft::fp8 {

template <class F8>
concept Format = std::same_as<F8, float8_e4m3> || std::same_as<F8, float8_e5m2>;

template <Format F8>
struct Tensorwise {
  using format = F8;
  static constexpr bool rowwise = false, pow2 = false;
  static std::string name() { return "tensorwise"; }
};
template <Format F8, bool P2 = true>
struct Rowwise {
  using format = F8;
  static constexpr bool rowwise = true, pow2 = P2;
  static std::string name() { return P2 ? "rowwise" : "rowwise (exact scales)"; }
};

template <class R>
concept Recipe = Format<typename R::format> && requires {
  { R::rowwise } -> std::convertible_to<bool>;
  { R::pow2 } -> std::convertible_to<bool>;
};

// An operand in float8 (row-major (rows, cols)) with its inverse scales: one, or one a row.
template <Format F8>
struct Quantized {
  std::int64_t rows = 0, cols = 0;
  std::vector<F8> q;
  std::vector<float> inv;
};

template <Recipe R>
Quantized<typename R::format> quantize(std::span<const float> x, std::int64_t rows, std::int64_t cols) {
  using F8 = typename R::format;
  if (rows < 0 || cols < 0 || static_cast<std::int64_t>(x.size()) != rows * cols)
    throw Error(cat("fp8::quantize<", R::name(), ">"), cat(x.size(), " values for a (", rows, ", ", cols, ") operand"),
                "pass rows x cols values");
  Quantized<F8> out{rows, cols, std::vector<F8>(x.size()), {}};
  const std::int64_t groups = R::rowwise ? rows : 1, per = R::rowwise ? cols : rows * cols;
  for (std::int64_t g = 0; g < groups; ++g) {
    const auto part = x.subspan(static_cast<std::size_t>(g * per), static_cast<std::size_t>(per));
    float amax = 0;
    for (const float v : part) amax = std::max(amax, std::abs(v));
    if (!std::isfinite(amax))
      throw Error(cat("fp8::quantize<", R::name(), ">"),
                  cat(R::rowwise ? cat("row ", g) : std::string("the tensor"), " holds an infinite or NaN value"),
                  "find the overflow upstream (the layer that produced it)");
    const float scale = float8_scale<F8>(amax, R::pow2);
    for (std::size_t i = 0; i < part.size(); ++i) out.q[static_cast<std::size_t>(g * per) + i] = F8(part[i] * scale);
    out.inv.push_back(1.0f / scale);
  }
  return out;
}

// y (M, N) = a (M, K) times b (N, K) transposed, dequantized by both operands' inverse scales.
template <Format A, Format B>
std::vector<float> scaled_gemm(const Quantized<A>& a, const Quantized<B>& b) {
  if (a.cols != b.cols)
    throw Error("fp8::scaled_gemm", cat("operands (", a.rows, ", ", a.cols, ") and (", b.rows, ", ", b.cols, ")"),
                "pass a (M, K) and b (N, K) with the same K");
  const std::int64_t M = a.rows, N = b.rows, K = a.cols;
  std::vector<float> af(a.q.size()), bf(b.q.size());
  for (std::size_t i = 0; i < af.size(); ++i) af[i] = static_cast<float>(a.q[i]);
  for (std::size_t i = 0; i < bf.size(); ++i) bf[i] = static_cast<float>(b.q[i]);
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (std::int64_t k = 0; k < K; ++k)
        s += af[static_cast<std::size_t>(m * K + k)] * bf[static_cast<std::size_t>(n * K + k)];
      const float ia = a.inv[a.inv.size() == 1 ? 0 : static_cast<std::size_t>(m)];
      const float ib = b.inv[b.inv.size() == 1 ? 0 : static_cast<std::size_t>(n)];
      y[static_cast<std::size_t>(m * N + n)] = s * ia * ib;
    }
  return y;
}

}  // namespace weft::fp8
