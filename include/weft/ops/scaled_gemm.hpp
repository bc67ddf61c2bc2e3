// ops::ScaledGemm: C (m, n) = alpha op(A) op(B) + beta C, as ops::Gemm, with op(A) and op(B) cast to
// float8 first as the precision's fp8::Gemms recipe says (core/float8_gemms.hpp): the GEMM of a
// linear layer under Precision<bf16, float, fp8::Gemms<...>>.
//
// On the host: op(A) as (m, k) and op(B) as (n, k) in float (the transposes a GPU's cast+transpose
// kernel writes), each quantized along k for its role (activation, weight, gradient); the float8
// values multiplied in f32 on the host GEMM, a K block at a time where the scales are blocked, and
// each block's (m, n) sums scaled by the operands' inverse scales and added, as fp8::scaled_gemm
// does (the reference, tests/ops/scaled_gemm.cpp); then alpha, beta and one rounding into C. The
// Meta device notes a GEMM. The GPU's is ops/scaled_gemm.cuh (cuBLASLt's FP8 GEMM, the same
// casts); a device without a specialization fails to compile, naming ops::ScaledGemm.
//
// defines: ops::ScaledGemm (Host, Meta)
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weft/core/float8_gemms.hpp"
#include "weft/core/precision.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

// op(X) as (rows, cols) floats, row-major: X (rows, cols) itself (t = no), or the transpose of X
// (cols, rows); ld is X's leading dimension.
template <class T>
std::vector<float> rows_of(const T* x, Trans t, index rows, index cols, index ld) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (index i = 0; i < rows; ++i)
    for (index j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(i * cols + j)] = static_cast<float>(t == Trans::no ? x[i * ld + j] : x[j * ld + i]);
  return out;
}

// y (M, N) = the dequantized product of a (M, K) and b (N, K)^T: for each K block (the finer of the
// two operands' scale blocks along K), the float8 values' product on the host GEMM in f32, scaled
// by both operands' inverse scales, the blocks added in order (fp8::scaled_gemm's arithmetic).
template <class A, class B>
std::vector<float> scaled_product(const fp8::Quantized<A>& a, const fp8::Quantized<B>& b) {
  const index M = a.rows, N = b.rows, K = a.cols;
  const index bk = std::min(a.block_cols, b.block_cols);
  std::vector<float> y(static_cast<std::size_t>(M * N), 0.0f);
  if (K == 0) return y;
  std::vector<float> af(a.q.size()), bf(b.q.size()), part(static_cast<std::size_t>(M * N));
  for (std::size_t i = 0; i < af.size(); ++i) af[i] = static_cast<float>(a.q[i]);
  for (std::size_t i = 0; i < bf.size(); ++i) bf[i] = static_cast<float>(b.q[i]);
  for (index k0 = 0; k0 < K; k0 += bk) {
    const index kb = std::min(bk, K - k0);
    gemm<float>(Trans::no, Trans::yes, M, N, kb, 1.0f, af.data() + k0, K, bf.data() + k0, K, 0.0f, part.data(), N);
    for (index i = 0; i < M; ++i)
      for (index j = 0; j < N; ++j) {
        const auto at = static_cast<std::size_t>(i * N + j);
        y[at] += part[at] * a.inv_at(i, k0) * b.inv_at(j, k0);
      }
  }
  return y;
}

// C (m, n) = alpha y + beta C, rounded once into C.
template <class C>
void scaled_store(C* c, index ldc, const std::vector<float>& y, index m, index n, float alpha, float beta) {
  for (index i = 0; i < m; ++i)
    for (index j = 0; j < n; ++j) {
      const float v = alpha * y[static_cast<std::size_t>(i * n + j)];
      C& out = c[i * ldc + j];
      out = static_cast<C>(beta == 0.0f ? v : v + beta * static_cast<float>(out));
    }
}

}  // namespace weft::host

namespace weft::ops {

template <class D>
struct ScaledGemm;

template <>
struct ScaledGemm<Host> {
  // G: an fp8::Gemms recipe; ra, rb: what op(A) and op(B) are; gemm: the GEMM's name for a refusal.
  // on_a, on_b: called with each operand's amaxes (one a scale block) before its cast, to reduce
  // them over the ranks that share the operand, or to set them (fp8::KeepAmaxes leaves them).
  template <class G, fp8::Operand ra, fp8::Operand rb, class T, class C, class FA = fp8::KeepAmaxes,
            class FB = fp8::KeepAmaxes>
  static void run(Host&, Trans ta, Trans tb, index m, index n, index k, acc<T> alpha, const T* a, index lda, const T* b,
                  index ldb, acc<T> beta, C* c, index ldc, const std::string& gemm, const FA& on_a = FA{},
                  const FB& on_b = FB{}) {
    static_assert(fp8::is_fp8_gemms<G>, "ops::ScaledGemm: G must be an fp8::Gemms recipe");
    static_assert(std::same_as<acc<T>, float>, "ops::ScaledGemm: the operands must be bf16 or f32");
    const host::Timed timed(host::Op::gemm);
    // op(A) as (m, k) and op(B)^T as (n, k): the operands' rows along K, as the casts take them.
    const auto cast = [&]<fp8::Operand role>(std::vector<float> x, index rows, const auto& on) {
      auto amax = G::template amaxes<role>(x, rows, k, gemm);
      on(std::span<float>(amax));
      return G::template cast<role>(x, rows, k, amax, gemm);
    };
    const auto qa = cast.template operator()<ra>(host::rows_of(a, ta, m, k, lda), m, on_a);
    const auto qb =
        cast.template operator()<rb>(host::rows_of(b, tb == Trans::no ? Trans::yes : Trans::no, n, k, ldb), n, on_b);
    host::scaled_store(c, ldc, host::scaled_product(qa, qb), m, n, alpha, beta);
  }
};

// The Meta device (cost/measure.hpp): the shape noted for the time model as a GEMM's, nothing
// computed; on_a and on_b see amaxes of the real count (zeros), so that the collectives a layer
// runs on them are counted as the step runs them.
template <class D>
struct ScaledGemm<Meta<D>> {
  template <class G, fp8::Operand ra, fp8::Operand rb, class Alpha, class T, class Beta, class C,
            class FA = fp8::KeepAmaxes, class FB = fp8::KeepAmaxes>
  static void run(Meta<D>& d, Trans ta, Trans tb, index m, index n, index k, Alpha, const T*, index, const T*, index,
                  Beta, C*, index, const std::string& gemm, const FA& on_a = FA{}, const FB& on_b = FB{}) {
    d.work.gemm(m, n, k, ta == Trans::yes, tb == Trans::yes, true);
    const auto count = [&]<fp8::Operand role>(index rows, const auto& on) {
      std::vector<float> amax(static_cast<std::size_t>(G::template amax_count<role>(rows, k, gemm)), 0.0f);
      on(std::span<float>(amax));
    };
    count.template operator()<ra>(m, on_a);
    count.template operator()<rb>(n, on_b);
  }
};

}  // namespace weft::ops

// The host kernels' instances (the operands' layout, the casts, the product and the store, for
// every recipe's formats), compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_SCALED_GEMM_PAIRS(EXTERN)                                                                            \
  EXTERN template std::vector<float> weft::host::rows_of<weft::bf16>(const weft::bf16*, weft::Trans, std::int64_t,     \
                                                                     std::int64_t, std::int64_t);                      \
  EXTERN template std::vector<float> weft::host::rows_of<float>(const float*, weft::Trans, std::int64_t, std::int64_t, \
                                                                std::int64_t);                                         \
  EXTERN template std::vector<float> weft::host::scaled_product<weft::float8_e4m3, weft::float8_e4m3>(                 \
      const weft::fp8::Quantized<weft::float8_e4m3>&, const weft::fp8::Quantized<weft::float8_e4m3>&);                 \
  EXTERN template std::vector<float> weft::host::scaled_product<weft::float8_e5m2, weft::float8_e4m3>(                 \
      const weft::fp8::Quantized<weft::float8_e5m2>&, const weft::fp8::Quantized<weft::float8_e4m3>&);                 \
  EXTERN template void weft::host::scaled_store<float>(float*, std::int64_t, const std::vector<float>&, std::int64_t,  \
                                                       std::int64_t, float, float);                                    \
  EXTERN template void weft::host::scaled_store<weft::bf16>(weft::bf16*, std::int64_t, const std::vector<float>&,      \
                                                            std::int64_t, std::int64_t, float, float);                 \
  EXTERN template std::vector<float> weft::fp8::block_amaxes<float>(std::span<const float>, std::int64_t,              \
                                                                    std::int64_t, std::int64_t, std::int64_t);         \
  EXTERN template weft::fp8::Quantized<weft::float8_e4m3> weft::fp8::cast_blocks<weft::float8_e4m3>(                   \
      std::span<const float>, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::span<const float>, bool,    \
      const std::string&);                                                                                             \
  EXTERN template weft::fp8::Quantized<weft::float8_e5m2> weft::fp8::cast_blocks<weft::float8_e5m2>(                   \
      std::span<const float>, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::span<const float>, bool,    \
      const std::string&);                                                                                             \
  EXTERN template weft::fp8::Quantized<weft::float8_e4m3>                                                              \
  weft::fp8::quantize<weft::fp8::Tensorwise<weft::float8_e4m3>>(std::span<const float>, std::int64_t, std::int64_t);   \
  EXTERN template weft::fp8::Quantized<weft::float8_e4m3>                                                              \
  weft::fp8::quantize<weft::fp8::Rowwise<weft::float8_e4m3, true>>(std::span<const float>, std::int64_t,               \
                                                                   std::int64_t);                                      \
  EXTERN template weft::fp8::Quantized<weft::float8_e4m3> weft::fp8::quantize_blocks<weft::float8_e4m3>(               \
      std::span<const float>, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool);                           \
  EXTERN template weft::fp8::Quantized<weft::float8_e5m2>                                                              \
  weft::fp8::quantize<weft::fp8::Tensorwise<weft::float8_e5m2>>(std::span<const float>, std::int64_t, std::int64_t);   \
  EXTERN template weft::fp8::Quantized<weft::float8_e5m2>                                                              \
  weft::fp8::quantize<weft::fp8::Rowwise<weft::float8_e5m2, true>>(std::span<const float>, std::int64_t,               \
                                                                   std::int64_t);                                      \
  EXTERN template weft::fp8::Quantized<weft::float8_e5m2> weft::fp8::quantize_blocks<weft::float8_e5m2>(               \
      std::span<const float>, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_SCALED_GEMM_PAIRS)
