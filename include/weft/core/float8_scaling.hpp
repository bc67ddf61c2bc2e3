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
// Delayed scaling (Transformer Engine's DelayedScaling), fp8::DelayedScaler<F8>: a tensor that recurs
// each step (a layer's input, its weight) is cast with a scale from the amaxes of earlier steps, so
// that the cast needs no pass over the tensor first. The scaler keeps an amax history of `length`
// steps (newest first) and a scale; quantize(x) casts with the scale and writes x's amax at the
// history's head; update() (once a step, after the step's casts) reduces the history (its max, or
// its newest), sets scale = F8's largest / amax / 2^margin where that amax is finite and positive
// (else the scale stays), and rolls the history, its head 0 for the next step. Values past the
// scale's range saturate (e4m3) and are counted (Quantized::saturated).
//
// Blockwise scaling, fp8::quantize_blocks: a scale for each (block_rows, block_cols) block (1x128 for
// activations and gradients, 128x128 for weights, DeepSeek-V3's); scaled_gemm then sums each K
// block apart and applies its scales.
//
// defines: fp8::Tensorwise, fp8::Rowwise, fp8::Recipe, fp8::Quantized, fp8::quantize, fp8::scaled_gemm,
// fp8::quantize_blocks, fp8::block_amaxes, fp8::BlockScales, fp8::block_scales, fp8::cast_blocks,
// fp8::AmaxReduction, fp8::DelayedScaler
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
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
  std::int64_t block_rows = 0, block_cols = 0;  // each scale's block: (rows, cols) tensorwise, (1, cols) rowwise
  std::vector<F8> q;
  std::vector<float> inv;      // (rows / block_rows, cols / block_cols), row-major
  std::int64_t saturated = 0;  // values whose magnitude times the scale passed F8's largest

  float inv_at(std::int64_t r, std::int64_t c) const {
    return inv[static_cast<std::size_t>((r / block_rows) * (cols / block_cols) + c / block_cols)];
  }
};

namespace detail {
// x must hold a (rows, cols) operand's values; `where` names the caller.
inline void check_operand(const std::string& where, std::span<const float> x, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<std::int64_t>(x.size()) != rows * cols)
    throw Error(where, cat(x.size(), " values for a (", rows, ", ", cols, ") operand"), "pass rows x cols values");
}
}  // namespace detail

// The largest magnitude of each (block_rows, block_cols) block of x (rows, cols), row-major over the
// blocks: the amaxes a cast's scales come from (one for a tensor, one a row, one a block). The
// blocks must tile x (the caller checks). T: float (or double, for a reference).
template <class T>
std::vector<float> block_amaxes(std::span<const T> x, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                                std::int64_t block_cols) {
  std::vector<float> amax(static_cast<std::size_t>((rows / block_rows) * (cols / block_cols)), 0.0f);
  const std::int64_t per_row = cols / block_cols;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto v = static_cast<float>(std::abs(x[static_cast<std::size_t>(r * cols + c)]));
      float& a = amax[static_cast<std::size_t>((r / block_rows) * per_row + c / block_cols)];
      a = std::max(a, std::isfinite(v) ? v : std::numeric_limits<float>::infinity());  // NaN too: cast refuses it
    }
  return amax;
}

// The scales of the (block_rows, block_cols) blocks of a (rows, cols) operand from their amaxes
// (float8_scale of each; pow2: rounded down to powers of two), and their inverses, which a GEMM
// applies. A non-finite amax is refused by name (the tensor, the row, or the block), `where` naming
// the operand. The GPU's casts take their scales from here too (ops/scaled_gemm.cuh).
struct BlockScales {
  std::vector<float> scale, inv;
};
template <Format F8>
BlockScales block_scales(std::span<const float> amaxes, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                         std::int64_t block_cols, bool pow2, const std::string& where) {
  const std::int64_t per_row = cols / block_cols;
  if (static_cast<std::int64_t>(amaxes.size()) != (rows / block_rows) * per_row)
    throw Error(where, cat(amaxes.size(), " amaxes for ", (rows / block_rows) * per_row, " blocks"),
                "pass one amax a block (block_amaxes)");
  BlockScales out{std::vector<float>(amaxes.size()), std::vector<float>(amaxes.size())};
  for (std::size_t b = 0; b < amaxes.size(); ++b) {
    if (!std::isfinite(amaxes[b])) {
      const std::int64_t br = static_cast<std::int64_t>(b) / per_row * block_rows,
                         bc = static_cast<std::int64_t>(b) % per_row * block_cols;
      const std::string what = block_rows == 1 && block_cols == cols      ? cat("row ", br)
                               : block_rows == rows && block_cols == cols ? std::string("the tensor")
                                                                          : cat("the block at (", br, ", ", bc, ")");
      throw Error(where, cat(what, " holds an infinite or NaN value"),
                  "find the overflow upstream (the layer that produced it)");
    }
    out.scale[b] = float8_scale<F8>(amaxes[b], pow2);
    out.inv[b] = 1.0f / out.scale[b];
  }
  return out;
}

// x (rows, cols) cast to F8 block by block, each block's scale float8_scale(its amax): amaxes as
// block_amaxes computes them, or larger (reduced over the ranks that share the operand, so that
// every rank scales alike). A non-finite amax is refused by name (block_scales).
template <Format F8>
Quantized<F8> cast_blocks(std::span<const float> x, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                          std::int64_t block_cols, std::span<const float> amaxes, bool pow2, const std::string& where) {
  BlockScales s = block_scales<F8>(amaxes, rows, cols, block_rows, block_cols, pow2, where);
  Quantized<F8> out{.rows = rows,
                    .cols = cols,
                    .block_rows = block_rows,
                    .block_cols = block_cols,
                    .q = std::vector<F8>(x.size()),
                    .inv = std::move(s.inv)};
  const std::int64_t per_row = cols / block_cols;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      out.q[i] = F8(x[i] * s.scale[static_cast<std::size_t>((r / block_rows) * per_row + c / block_cols)]);
    }
  return out;
}

template <Recipe R>
Quantized<typename R::format> quantize(std::span<const float> x, std::int64_t rows, std::int64_t cols) {
  const std::string where = cat("fp8::quantize<", R::name(), ">");
  detail::check_operand(where, x, rows, cols);
  const std::int64_t block_rows = R::rowwise ? 1 : std::max<std::int64_t>(rows, 1),
                     block_cols = std::max<std::int64_t>(cols, 1);
  return cast_blocks<typename R::format>(x, rows, cols, block_rows, block_cols,
                                         block_amaxes(x, rows, cols, block_rows, block_cols), R::pow2, where);
}

// y (M, N) = a (M, K) times b (N, K) transposed, dequantized by both operands' inverse scales: each
// K block's sum (the operands' block_cols, which must agree unless one covers K) times its scales,
// the blocks' products summed in order.
template <Format A, Format B>
std::vector<float> scaled_gemm(const Quantized<A>& a, const Quantized<B>& b) {
  if (a.cols != b.cols)
    throw Error("fp8::scaled_gemm", cat("operands (", a.rows, ", ", a.cols, ") and (", b.rows, ", ", b.cols, ")"),
                "pass a (M, K) and b (N, K) with the same K");
  const std::int64_t M = a.rows, N = b.rows, K = a.cols;
  const std::int64_t bk = std::min(a.block_cols, b.block_cols);
  if (K > 0 && (bk < 1 || a.block_cols % bk != 0 || b.block_cols % bk != 0))
    throw Error("fp8::scaled_gemm", cat("scale blocks of ", a.block_cols, " and ", b.block_cols, " along K = ", K),
                "quantize both operands with the same block along K (or one scale over K)");
  std::vector<float> af(a.q.size()), bf(b.q.size());
  for (std::size_t i = 0; i < af.size(); ++i) af[i] = static_cast<float>(a.q[i]);
  for (std::size_t i = 0; i < bf.size(); ++i) bf[i] = static_cast<float>(b.q[i]);
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float total = 0;
      for (std::int64_t k0 = 0; k0 < K; k0 += bk) {
        float s = 0;
        for (std::int64_t k = k0; k < k0 + bk; ++k)
          s += af[static_cast<std::size_t>(m * K + k)] * bf[static_cast<std::size_t>(n * K + k)];
        const float part = s * a.inv_at(m, k0) * b.inv_at(n, k0);
        total = k0 == 0 ? part : total + part;
      }
      y[static_cast<std::size_t>(m * N + n)] = total;
    }
  return y;
}

// Blockwise scaling (DeepSeek-V3's; Transformer Engine's Float8BlockScaling): a scale for each
// (block_rows, block_cols) block from its own amax, 1x128 for activations and gradients, 128x128 for
// weights. The blocks must tile the operand.
template <Format F8>
Quantized<F8> quantize_blocks(std::span<const float> x, std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                              std::int64_t block_cols, bool pow2 = false) {
  const std::string where = cat("fp8::quantize_blocks(", block_rows, "x", block_cols, ")");
  detail::check_operand(where, x, rows, cols);
  if (block_rows < 1 || block_cols < 1 || rows % block_rows != 0 || cols % block_cols != 0)
    throw Error(where, cat("blocks of ", block_rows, "x", block_cols, " over a (", rows, ", ", cols, ") operand"),
                "choose blocks that divide the operand's rows and columns (128 along K, as DeepSeek-V3's)");
  return cast_blocks<F8>(x, rows, cols, block_rows, block_cols, block_amaxes(x, rows, cols, block_rows, block_cols),
                         pow2, where);
}

enum class AmaxReduction { max, most_recent };

template <Format F8>
class DelayedScaler {
 public:
  explicit DelayedScaler(std::int64_t length, AmaxReduction reduce = AmaxReduction::max, int margin = 0)
      : reduce_(reduce), margin_(margin) {
    if (length < 1 || margin < 0)
      throw Error("fp8::DelayedScaler", cat("an amax history of ", length, " steps, margin ", margin),
                  "keep at least 1 step of history and a margin of 0 or more");
    history_.assign(static_cast<std::size_t>(length), 0.0f);
  }

  // x (rows, cols) cast with the current scale; its amax goes to the history's head.
  Quantized<F8> quantize(std::span<const float> x, std::int64_t rows, std::int64_t cols) {
    detail::check_operand("fp8::DelayedScaler::quantize", x, rows, cols);
    Quantized<F8> out{.rows = rows,
                      .cols = cols,
                      .block_rows = rows,
                      .block_cols = cols,
                      .q = std::vector<F8>(x.size()),
                      .inv = {1.0f / scale_}};
    float amax = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      amax = std::max(amax, std::abs(x[i]));
      const float v = x[i] * scale_;
      out.saturated += std::abs(v) > F8::max();
      out.q[i] = F8(v);
    }
    history_[0] = std::max(history_[0], amax);
    return out;
  }

  // The step's end: the next scale from the history, and the history rolled.
  void update() {
    const float amax =
        reduce_ == AmaxReduction::max ? *std::max_element(history_.begin(), history_.end()) : history_[0];
    if (amax > 0 && std::isfinite(amax))
      scale_ = F8::max() / amax / std::ldexp(1.0f, margin_);                 // in float, as Transformer Engine's
    std::rotate(history_.rbegin(), history_.rbegin() + 1, history_.rend());  // newest first, oldest out
    history_[0] = 0;
  }

  float scale() const { return scale_; }
  const std::vector<float>& history() const { return history_; }

 private:
  AmaxReduction reduce_;
  int margin_;
  std::vector<float> history_;
  float scale_ = 1.0f;
};

}  // namespace weft::fp8
