// ops::Gemm on the Cuda device (see gemm.hpp for the op's template and the host's).
//
// Include only from .cu translation units (ops/all.cuh includes every op).
//
// defines: ops::Gemm (Cuda)
#pragma once

#include <cstdint>
#include <memory>

#include "weft/device/cuda/gemm.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/gemm.hpp"

namespace weft::ops {

template <>
struct Gemm<Cuda> {
  // C (m, n) = alpha op(A) op(B) + beta C; A, B in T, C in T or float; f32 accumulation.
  template <class T, class C>
  static void run(Cuda& d, Trans ta, Trans tb, index m, index n, index k, float alpha, const T* a, index lda,
                  const T* b, index ldb, float beta, C* c, index ldc) {
    const cuda::Timed timed(d, cuda::OpKind::gemm);
    static_assert(cuda::Activation<T>, "ops::Gemm<Cuda>: operands must be float or bf16 (f64 is the host's)");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta C
      if (beta == 0.0f) {
        for (index i = 0; i < m; ++i) d.zero(c + i * ldc, static_cast<std::size_t>(n) * sizeof(C));
        return;
      }
      if (beta == 1.0f) return;
      throw Error("ops::Gemm<Cuda>", cat("k 0 with beta ", beta), "pass beta 0 or 1 for an empty product");
    }
    blas(d).gemm<T, C>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, alpha, beta);
  }

  // The device's cuBLASLt handle and workspace, made on first use (ScaledGemm's FP8 GEMM shares it).
  static cuda::Blas& blas(Cuda& d) {
    if (!d.handles) d.handles = std::make_shared<cuda::Blas>(d);
    return *static_cast<cuda::Blas*>(d.handles.get());
  }
};

}  // namespace weft::ops
