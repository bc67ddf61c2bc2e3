// Host GEMM through Eigen: C = alpha * op(A) * op(B) + beta * C, row-major, as cuBLAS-style
// arguments (op = transpose or not, leading dimensions in elements).
//
// Shapes: op(A) is (m, k), op(B) is (k, n), C is (m, n). A stored (m, k) with lda >= k, or (k, m)
// with lda >= m when transposed; likewise B. With beta == 0, C is not read (it may hold NaN).
// This is the host reference that the CUDA GEMM is tested against, and the compute of the host
// back end; Eigen picks the blocking and the vector width.
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "weft/core/error.hpp"
#include "weft/device/ops.hpp"

namespace weft::host {

using weft::Trans;

template <class T>
void gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "host::gemm: element type must be float or double; convert bf16 to float first");
  const std::int64_t a_cols = ta == Trans::yes ? m : k, b_cols = tb == Trans::yes ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < a_cols || ldb < b_cols || ldc < n)
    throw Error("host::gemm",
                cat("m ", m, ", n ", n, ", k ", k, " with lda ", lda, ", ldb ", ldb, ", ldc ", ldc,
                    " (need lda >= ", a_cols, ", ldb >= ", b_cols, ", ldc >= ", n, ")"),
                "pass non-negative sizes and leading dimensions at least the row length");
  if (m == 0 || n == 0) return;

  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  using CMap = Eigen::Map<const Mat, Eigen::Unaligned, Stride>;
  Eigen::Map<Mat, Eigen::Unaligned, Stride> C(c, m, n, Stride(ldc));
  if (k == 0 || alpha == T(0)) {
    if (beta == T(0)) C.setZero();
    else C *= beta;
    return;
  }
  const CMap A(a, ta == Trans::yes ? k : m, a_cols, Stride(lda));
  const CMap B(b, tb == Trans::yes ? n : k, b_cols, Stride(ldb));
  auto run = [&](const auto& opA, const auto& opB) {
    if (beta == T(0)) C.noalias() = alpha * (opA * opB);
    else {
      if (beta != T(1)) C *= beta;
      C.noalias() += alpha * (opA * opB);
    }
  };
  if (ta == Trans::no && tb == Trans::no) run(A, B);
  else if (ta == Trans::no) run(A, B.transpose());
  else if (tb == Trans::no) run(A.transpose(), B);
  else run(A.transpose(), B.transpose());
}

}  // namespace weft::host
