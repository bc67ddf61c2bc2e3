// ops::ScaledGemm on the Cuda device (see scaled_gemm.hpp for the op and the host's): the linear
// layers' GEMMs on float8 casts, cast as the host casts them, multiplied by cuBLASLt's FP8 GEMM.
//
// Each operand, op(A) as (m, k) and op(B)^T as (n, k) (K contiguous, as cuBLASLt's FP8 kernels
// read both), takes three kernels and a look at its amaxes on the host:
//   1. fp8_amax: the largest magnitude of each scale block (the recipe's: the tensor, a row, or a
//      1xB / BxB block), an infinite or NaN value as infinity; one CUDA block reduces a scale block's
//      share with a CUB block reduction and merges it with an integer atomicMax on the float's bits
//      (non-negative floats order as their bits do: exact, and the same on every run);
//   2. the amaxes copied to the host, where the layer's hook reduces them over the ranks that share
//      the operand (fp8::Gemms::reduces; the hook runs on host memory, which is why a tensor-parallel
//      FP8 layer on the GPU is refused for now: nn/linear.hpp), and fp8::Gemms::scales turns them
//      into scales, refusing a non-finite one by the operand's name as the host's cast does;
//   3. fp8_cast: op(X) read (transposed where the GEMM reads it so: the cast writes the layout the
//      GEMM wants), times its block's scale in float, to float8 by weft's own conversion
//      (core/float8.hpp's, PyTorch's bytes), rows padded with zeros to a multiple of 16 bytes.
// So the float8 bytes and scales equal the host's bit for bit (tests/device/cuda/float8.cu checks
// them). The product: tensorwise and rowwise in one cuBLASLt call (scalar or outer-vector scales),
// alpha and beta applied by it; blockwise as the host computes it, one call a K block (each block's
// scales an outer vector: an activation's rows, a weight's 128-row blocks widened to its rows)
// summed in f32 scratch, then alpha and beta in one rounding into C. cuBLASLt's own 1x128 / 128x128
// scale modes (one call) are the faster path, not taken yet. The forward GEMM (activation x weight)
// accumulates with cuBLASLt's fast accumulation, as torchao and Transformer Engine do; the gradient
// GEMMs promote their partial sums.
//
// Compiled, not yet run on a GPU (no GPU was lent since it was written: issue 48); scripts/gpu-check
// runs tests/device/cuda/float8.cu against the host's ScaledGemm.
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::ScaledGemm (Cuda), cuda::fp8_amaxes, cuda::fp8_cast
#pragma once

#include <cub/block/block_reduce.cuh>

#include <bit>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "weft/core/float8_gemms.hpp"
#include "weft/device/cuda/gemm.cuh"
#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/gemm.cuh"
#include "weft/ops/scaled_gemm.hpp"

namespace weft::cuda {

namespace detail {
// op(X)'s element (r, c): X (rows, cols) itself with leading dimension ld, or (trans) its transpose.
template <class T>
__device__ inline float op_at(const T* x, bool trans, index r, index c, index ld) {
  return to_f(trans ? x[c * ld + r] : x[r * ld + c]);
}
}  // namespace detail

// ---- amaxes ----------------------------------------------------------------------------------
// Block (b, s) of the grid: scale block b's elements s, s + splits, ... of its (br x bc) values.
template <class T, int Threads>
__global__ void fp8_amax_kernel(const T* x, bool trans, index K, index ld, index br, index bc, int splits,
                                unsigned* amax_bits) {
  using Reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename Reduce::TempStorage tmp;
  const index b = blockIdx.x, per_row = K / bc, r0 = (b / per_row) * br, c0 = (b % per_row) * bc;
  const index n = br * bc;
  float m = 0;
  for (index i = static_cast<index>(blockIdx.y) * Threads + threadIdx.x; i < n;
       i += static_cast<index>(splits) * Threads) {
    const float v = fabsf(detail::op_at(x, trans, r0 + i / bc, c0 + i % bc, ld));
    m = fmaxf(m, v <= 3.402823466e38f ? v : __int_as_float(0x7f800000));  // infinity and NaN: infinity
  }
  const float block = Reduce(tmp).Reduce(m, [](float a, float c) { return fmaxf(a, c); });
  if (threadIdx.x == 0) atomicMax(amax_bits + b, __float_as_uint(block));
}

// The amaxes of op(X) (rows, K) in (br, bc) blocks, row-major over the blocks, on the host.
template <Activation T>
std::vector<float> fp8_amaxes(Cuda& d, const T* x, bool trans, index rows, index K, index ld, index br, index bc) {
  const index blocks = (rows / br) * (K / bc);
  std::vector<float> out(static_cast<std::size_t>(blocks), 0.0f);
  if (blocks == 0) return out;
  Allocation bits = d.allocate(blocks * static_cast<index>(sizeof(unsigned)), Category::activations);
  d.zero(bits.data(), static_cast<std::size_t>(bits.bytes()));
  constexpr int threads = 256;
  // Enough CUDA blocks to fill the GPU when there are few scale blocks (a tensor's one).
  const index per_block = br * bc;
  const int splits = static_cast<int>(
      std::max<index>(1, std::min<index>(1024 / std::min<index>(blocks, 1024), (per_block + threads - 1) / threads)));
  fp8_amax_kernel<detail::dev_t<T>, threads>
      <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(splits)), threads, 0, d.stream()>>>(
          detail::dev(x), trans, K, ld, br, bc, splits, static_cast<unsigned*>(bits.data()));
  check_launch("fp8_amaxes");
  std::vector<unsigned> got(out.size());
  d.to_host(got.data(), bits.data(), got.size() * sizeof(unsigned));
  for (std::size_t i = 0; i < got.size(); ++i) out[i] = std::bit_cast<float>(got[i]);
  return out;
}

// ---- the cast --------------------------------------------------------------------------------
template <class T, class F8>
__global__ void fp8_cast_kernel(const T* x, bool trans, index rows, index K, index ld, index br, index bc,
                                const float* scale, std::uint8_t* q, index ldq) {
  const index per_row = K / bc;
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < rows * ldq;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index r = i / ldq, c = i % ldq;
    q[i] = c < K ? F8::format::encode(detail::op_at(x, trans, r, c, ld) * scale[(r / br) * per_row + c / bc]) : 0;
  }
}

// q (rows, ldq) = float8 of op(X) (rows, K) times its (br, bc) block's scale (on the device), each
// row padded with zeros from K to ldq.
template <class F8, Activation T>
void fp8_cast(Cuda& d, const T* x, bool trans, index rows, index K, index ld, index br, index bc, const float* scale,
              std::uint8_t* q, index ldq) {
  if (rows * ldq == 0) return;
  fp8_cast_kernel<detail::dev_t<T>, F8><<<detail::blocks_for(rows * ldq, 256), 256, 0, d.stream()>>>(
      detail::dev(x), trans, rows, K, ld, br, bc, scale, q, ldq);
  check_launch("fp8_cast");
}

// C (m, n) = alpha y + beta C in one rounding (y f32, m x n): the blockwise product's store.
template <class C>
__global__ void fp8_store_kernel(C* c, index ldc, const float* y, index m, index n, float alpha, float beta) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < m * n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    C& out = c[(i / n) * ldc + i % n];
    const float v = alpha * y[i];
    out = detail::from_f<C>(beta == 0.0f ? v : v + beta * detail::to_f(out));
  }
}

namespace detail {
// A float8 operand on the device: (rows, ld) bytes, its inverse scales by block, and its blocks.
struct Fp8Operand {
  Allocation q, inv;
  std::vector<float> inv_host;
  index rows = 0, ld = 0, br = 1, bc = 1;
};
inline index fp8_row_bytes(index k) { return (k + 15) / 16 * 16; }
template <class F8> constexpr cudaDataType_t fp8_type = std::same_as<F8, float8_e4m3> ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}  // namespace detail

}  // namespace weft::cuda

namespace weft::ops {

template <>
struct ScaledGemm<Cuda> {
  template <class G, fp8::Operand ra, fp8::Operand rb, class T, class C, class FA = fp8::KeepAmaxes,
            class FB = fp8::KeepAmaxes>
  static void run(Cuda& d, Trans ta, Trans tb, index m, index n, index k, float alpha, const T* a, index lda,
                  const T* b, index ldb, float beta, C* c, index ldc, const std::string& gemm, const FA& on_a = FA{},
                  const FB& on_b = FB{}) {
    static_assert(fp8::is_fp8_gemms<G>, "ops::ScaledGemm: G must be an fp8::Gemms recipe");
    static_assert(cuda::Activation<T>, "ops::ScaledGemm<Cuda>: the operands must be bf16 or f32");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta C, as the GEMM does
      Gemm<Cuda>::run(d, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    const cuda::Timed timed(d, cuda::OpKind::gemm);
    const index ldq = cuda::detail::fp8_row_bytes(k);
    // op(X) (rows, k) cast for its role: amaxes, the hook, the scales, the cast.
    const auto cast = [&]<fp8::Operand role>(const T* x, bool trans, index rows, index ld, const auto& on) {
      using F8 = typename G::template format<role>;
      cuda::detail::Fp8Operand out;
      const auto [br, bc] = G::template blocks<role>(rows, k, gemm);
      std::vector<float> amax = cuda::fp8_amaxes(d, x, trans, rows, k, ld, br, bc);
      on(std::span<float>(amax));
      const fp8::BlockScales s = G::template scales<role>(rows, k, amax, gemm);
      Allocation scale = d.allocate(static_cast<index>(s.scale.size() * sizeof(float)), Category::activations);
      d.from_host(scale.data(), s.scale.data(), s.scale.size() * sizeof(float));
      out.q = d.allocate(rows * ldq, Category::activations);
      cuda::fp8_cast<F8>(d, x, trans, rows, k, ld, br, bc, static_cast<const float*>(scale.data()),
                         static_cast<std::uint8_t*>(out.q.data()), ldq);
      out.inv_host = s.inv;
      out.rows = rows, out.ld = ldq, out.br = br, out.bc = bc;
      return out;  // the scales' buffer is freed in stream order, after the cast
    };
    const auto qa = cast.template operator()<ra>(a, ta == Trans::yes, m, lda, on_a);
    const auto qb = cast.template operator()<rb>(b, tb == Trans::no, n, ldb, on_b);
    constexpr cudaDataType_t type_a = cuda::detail::fp8_type<typename G::template format<ra>>;
    constexpr cudaDataType_t type_b = cuda::detail::fp8_type<typename G::template format<rb>>;
    constexpr bool forward = ra == fp8::Operand::activation && rb == fp8::Operand::weight;
    cuda::Blas& blas = Gemm<Cuda>::blas(d);
    const auto upload = [&](const std::vector<float>& v) {
      Allocation out = d.allocate(static_cast<index>(v.size() * sizeof(float)), Category::activations);
      d.from_host(out.data(), v.data(), v.size() * sizeof(float));
      return out;
    };
    if (qa.bc == k && qb.bc == k) {  // tensorwise or rowwise: one call
      const bool vectors = !std::same_as<typename G::scaling_rule, fp8::scaling::Tensorwise>;
      const Allocation ia = upload(qa.inv_host), ib = upload(qb.inv_host);
      blas.gemm_fp8<C>(m, n, k, qa.q.data(), type_a, ldq, static_cast<const float*>(ia.data()), qb.q.data(), type_b,
                       ldq, static_cast<const float*>(ib.data()), vectors, c, ldc, alpha, beta, forward);
      return;
    }
    // Blockwise: a call a K block, each block's scales widened to one a row, summed in f32.
    const index bk = std::min(qa.bc, qb.bc);
    if (bk % 16 != 0)
      throw Error(gemm, cat("blockwise FP8 on the GPU in blocks of ", bk, " along K"),
                  "use blocks of a multiple of 16 (128, DeepSeek-V3's) on the GPU");
    const index blocks_k = k / bk;
    const auto widen = [&](const cuda::detail::Fp8Operand& o) {
      std::vector<float> v(static_cast<std::size_t>(blocks_k * o.rows));
      const index per_row = k / o.bc;
      for (index kb = 0; kb < blocks_k; ++kb)
        for (index r = 0; r < o.rows; ++r)
          v[static_cast<std::size_t>(kb * o.rows + r)] =
              o.inv_host[static_cast<std::size_t>((r / o.br) * per_row + kb * bk / o.bc)];
      return v;
    };
    const Allocation ia = upload(widen(qa)), ib = upload(widen(qb));
    Allocation y = d.allocate(m * n * static_cast<index>(sizeof(float)), Category::activations);
    for (index kb = 0; kb < blocks_k; ++kb)
      blas.gemm_fp8<float>(m, n, bk, static_cast<const std::uint8_t*>(qa.q.data()) + kb * bk, type_a, ldq,
                           static_cast<const float*>(ia.data()) + kb * m,
                           static_cast<const std::uint8_t*>(qb.q.data()) + kb * bk, type_b, ldq,
                           static_cast<const float*>(ib.data()) + kb * n, true, static_cast<float*>(y.data()), n, 1.0f,
                           kb == 0 ? 0.0f : 1.0f, forward);
    cuda::fp8_store_kernel<cuda::detail::dev_t<C>><<<cuda::detail::blocks_for(m * n, 256), 256, 0, d.stream()>>>(
        cuda::detail::dev(c), ldc, static_cast<const float*>(y.data()), m, n, alpha, beta);
    cuda::check_launch("fp8_store");
  }
};

}  // namespace weft::ops
