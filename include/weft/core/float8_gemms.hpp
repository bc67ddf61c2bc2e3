// fp8::Gemms<Scaling, Grad>: a linear layer's three GEMMs with float8 operands, the third parameter
// of a precision (core/precision.hpp): Precision<bf16, float, fp8::Gemms<fp8::scaling::Rowwise>>.
// Everything else of that precision is bf16 compute with f32 gradients, master weights and optimizer
// state; the linear layers keep their weights in bf16 and cast them (and their inputs and output
// gradients) to float8 for each GEMM, current scaling (each cast's scale from that operand's amax).
//
//   GEMM     what it computes               its operands, each (rows, K)         K
//   forward  y (N, out) = x W^T             x (N, in) e4m3, W (out, in) e4m3     in
//   dgrad    dx (N, in) = dy W              dy (N, out) Grad, W^T (in, out) e4m3 out
//   wgrad    dW (out, in) += dy^T x         dy^T (out, N) Grad, x^T (in, N) e4m3 N (tokens)
//
// Grad: float8_e5m2 (the "hybrid" recipe, Transformer Engine's default: gradients need range more
// than precision) or float8_e4m3. Scaling, of each operand along its K:
//
//   scaling::Tensorwise    one scale an operand                 torchao's TENSORWISE
//   scaling::Rowwise       one a row, rounded down to a power   torchao's ROWWISE
//                          of two
//   scaling::Blockwise<B>  one a 1 x B block of an activation   DeepSeek-V3's, Transformer Engine's
//                          or gradient, one a B x B block of a  Float8BlockScaling (B = 128)
//                          weight (B must divide K, and a
//                          weight's rows)
//
// The GEMM (ops::ScaledGemm) sums the products of the float8 values in f32, in K blocks where
// the scales are blocked, and applies the two operands' inverse scales to each block's sum:
// fp8::scaled_gemm's arithmetic (core/float8_scaling.hpp), which tests/core/float8_scaling.cpp
// holds to torch._scaled_mm. Delayed scaling (fp8::DelayedScaler) is not yet a Scaling here.
//
// This header is plain C++20.
//
// defines: fp8::Operand, fp8::KeepAmaxes, fp8::scaling::Tensorwise, fp8::scaling::Rowwise, fp8::scaling::Blockwise,
// fp8::Gemms, Fp8Tensorwise, Fp8Rowwise, Fp8Blockwise
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/float8.hpp"
#include "weft/core/float8_scaling.hpp"
#include "weft/core/precision.hpp"

namespace weft::fp8 {

// What a GEMM operand is: its format (e4m3, or Grad for a gradient) and, blockwise, its blocks.
enum class Operand { activation, weight, gradient };

namespace scaling {
struct Tensorwise {
  static std::string name() { return "tensorwise"; }
};
struct Rowwise {
  static std::string name() { return "rowwise"; }
};
template <std::int64_t B = 128>
struct Blockwise {
  static_assert(B >= 1, "fp8::scaling::Blockwise<B>: B must be at least 1 (DeepSeek-V3's is 128)");
  static constexpr std::int64_t block = B;
  static std::string name() { return cat("blockwise 1x", B, "/", B, "x", B); }
};
}  // namespace scaling

template <class S> inline constexpr bool is_blockwise = false;
template <std::int64_t B> inline constexpr bool is_blockwise<scaling::Blockwise<B>> = true;

template <class S>
concept Scaling = std::same_as<S, scaling::Tensorwise> || std::same_as<S, scaling::Rowwise> || is_blockwise<S>;

// A hook of ops::ScaledGemm that leaves an operand's amaxes as they are (one rank's operand).
struct KeepAmaxes {
  void operator()(std::span<float>) const {}
};

template <Scaling S, Format Grad = float8_e5m2>
struct Gemms {
  static constexpr bool fp8 = true;
  using scaling_rule = S;
  using grad = Grad;  // the output gradients' format
  static std::string name() {
    return cat("fp8 ", S::name(), std::same_as<Grad, float8_e5m2> ? ", e4m3/e5m2" : ", e4m3");
  }

  // The format an operand of this role is cast to.
  template <Operand role>
  using format = std::conditional_t<role == Operand::gradient, Grad, float8_e4m3>;

  // The scale blocks of an operand (rows, K) of this role: (rows, K) tensorwise, (1, K) rowwise,
  // (1, B) or (B, B) for a weight blockwise; a block that does not tile the operand is refused,
  // `gemm` naming the GEMM.
  template <Operand role>
  static std::pair<std::int64_t, std::int64_t> blocks(std::int64_t rows, std::int64_t K, const std::string& gemm) {
    if constexpr (std::same_as<S, scaling::Tensorwise>) {
      return {std::max<std::int64_t>(rows, 1), std::max<std::int64_t>(K, 1)};
    } else if constexpr (std::same_as<S, scaling::Rowwise>) {
      return {1, std::max<std::int64_t>(K, 1)};
    } else {
      constexpr std::int64_t B = S::block;
      const std::int64_t block_rows = role == Operand::weight ? B : 1;
      if (K % B != 0 || rows % block_rows != 0)
        throw Error(cat(name(), ": ", gemm),
                    cat(role == Operand::weight ? "a weight operand (" : "an operand (", rows, ", ", K,
                        ") does not tile into ", block_rows, "x", B, " blocks"),
                    cat("use a block B that divides the layers' widths and the tokens a rank takes (",
                        "fp8::scaling::Blockwise<B>), or rowwise scaling"));
      return {block_rows, B};
    }
  }

  // How many amaxes (scale blocks) an operand (rows, K) of this role has: what a cast's hook sees.
  template <Operand role>
  static std::int64_t amax_count(std::int64_t rows, std::int64_t K, const std::string& gemm) {
    const auto [br, bc] = blocks<role>(rows, K, gemm);
    return (rows / br) * (K / bc);
  }

  // Whether an operand's amaxes must be reduced (max) over the ranks its tensor is sharded over
  // before the cast, so that every layout scales as one rank does: when a scale's block spans the
  // shards. An operand sharded along K spans them tensorwise and rowwise; one sharded along its
  // rows only tensorwise. Blockwise blocks lie within a shard (the blocks tile each shard).
  static constexpr bool reduces(bool k_sharded, bool rows_sharded) {
    return !is_blockwise<S> && (k_sharded || (rows_sharded && std::same_as<S, scaling::Tensorwise>));
  }

  // An operand (rows, K), row-major, cast as this recipe casts an operand of its role, in two steps
  // (so that the amaxes can be reduced over ranks between them): its amaxes, one a scale block;
  // then the cast with those amaxes (or larger ones). `gemm` names the GEMM for a refusal.
  template <Operand role>
  static std::vector<float> amaxes(std::span<const float> x, std::int64_t rows, std::int64_t K,
                                   const std::string& gemm) {
    const auto [br, bc] = blocks<role>(rows, K, gemm);
    detail::check_operand(cat(name(), ": ", gemm), x, rows, K);
    return block_amaxes(x, rows, K, br, bc);
  }
  template <Operand role>
  static Quantized<format<role>> cast(std::span<const float> x, std::int64_t rows, std::int64_t K,
                                      std::span<const float> amax, const std::string& gemm) {
    const auto [br, bc] = blocks<role>(rows, K, gemm);
    return cast_blocks<format<role>>(x, rows, K, br, bc, amax, std::same_as<S, scaling::Rowwise>,
                                     operand_name<role>(gemm));
  }
  // The scales such a cast multiplies by, and their inverses (a device that casts on its own: the
  // GPU's, ops/scaled_gemm.cuh); refused as cast refuses.
  template <Operand role>
  static BlockScales scales(std::int64_t rows, std::int64_t K, std::span<const float> amax, const std::string& gemm) {
    const auto [br, bc] = blocks<role>(rows, K, gemm);
    return block_scales<format<role>>(amax, rows, K, br, bc, std::same_as<S, scaling::Rowwise>,
                                      operand_name<role>(gemm));
  }
  template <Operand role>
  static std::string operand_name(const std::string& gemm) {
    constexpr const char* what = role == Operand::activation ? "input"
                                 : role == Operand::weight   ? "weight"
                                                             : "gradient";
    return cat(name(), ": ", gemm, ", its ", what);
  }
  template <Operand role>
  static Quantized<format<role>> quantize(std::span<const float> x, std::int64_t rows, std::int64_t K,
                                          const std::string& gemm) {
    return cast<role>(x, rows, K, amaxes<role>(x, rows, K, gemm), gemm);
  }
};

template <class G> inline constexpr bool is_fp8_gemms = false;
template <class S, class Grad> inline constexpr bool is_fp8_gemms<Gemms<S, Grad>> = true;

}  // namespace weft::fp8

namespace weft {
// The trainer's FP8 precisions (weft-train --dtype fp8-tensorwise, fp8-rowwise, fp8-blockwise):
// bf16 compute, f32 master weights, e5m2 gradients, blockwise in DeepSeek-V3's 128-wide blocks.
using Fp8Tensorwise = Precision<bf16, float, fp8::Gemms<fp8::scaling::Tensorwise>>;
using Fp8Rowwise = Precision<bf16, float, fp8::Gemms<fp8::scaling::Rowwise>>;
using Fp8Blockwise = Precision<bf16, float, fp8::Gemms<fp8::scaling::Blockwise<128>>>;
}  // namespace weft
