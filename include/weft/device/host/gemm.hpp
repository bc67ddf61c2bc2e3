// Host GEMM: C = alpha * op(A) * op(B) + beta * C, row-major, as cuBLAS-style arguments (op =
// transpose or not, leading dimensions in elements).
//
// Shapes: op(A) is (m, k), op(B) is (k, n), C is (m, n). A stored (m, k) with lda >= k, or (k, m)
// with lda >= m when transposed; likewise B. With beta == 0, C is not read (it may hold NaN).
// This is the host reference that the CUDA GEMM is tested against, and the compute of the host
// back end. It runs on OpenBLAS (a threaded build, set to one thread) when weft was configured with
// it (WEFT_HOST_GEMM; docs/performance.md has the measurements), else on Eigen; either way each
// element's sum runs in an order fixed by the shapes, so results are bitwise repeatable run to run
// and rank to rank.
//
// OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE or its own CPU table. On a CPU
// with AVX-512, its AVX2 (Haswell) kernels (OPENBLAS_CORETYPE=Haswell, as this project's machines
// set) run a step's GEMMs at 0.7x Eigen's AVX-512 code, and its AVX-512 ones at 1.35x
// (docs/performance.md). So where Eigen was compiled for AVX-512 and OpenBLAS runs other kernels,
// GEMMs stay on Eigen. The choice depends on the build, the CPU and the environment, never on a
// timing, so every rank of a run makes the same one; gemm_library() names what runs, and why.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#ifndef WEFT_HOST_OPENBLAS
#define WEFT_HOST_OPENBLAS 0
#endif
#if WEFT_HOST_OPENBLAS
#include <cblas.h>
#endif

#include "weft/core/error.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/trans.hpp"

namespace weft::host {

using weft::Trans;

namespace detail {

// Whether OpenBLAS's kernels by this name (openblas_get_corename) are its AVX-512 ones.
inline bool avx512_kernels(const std::string& core) {
  return core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
}

// Whether GEMMs run on OpenBLAS (use), its kernels (core), and why not (why), decided on first use,
// which sets OpenBLAS to one thread (weft runs one thread per rank, and a lone rank's GEMMs split
// their rows over host::set_threads's threads itself). Only a threaded build is used: its buffers are locked, while a
// serial build shares them without locks, and concurrent calls from thread ranks corrupt each other's results.
struct OpenBlas {
  bool use = false;
  std::string core, why;
};
inline const OpenBlas& openblas() {
  static const OpenBlas lib = [] {
    OpenBlas l;
#if WEFT_HOST_OPENBLAS
    openblas_set_num_threads(1);
    if (const char* name = openblas_get_corename()) l.core = name;
    if (openblas_get_parallel() == 0) {
      l.why = "OpenBLAS is a serial build, not safe with thread ranks";
      return l;
    }
#if defined(EIGEN_VECTORIZE_AVX512)
    if (!avx512_kernels(l.core)) {
      const char* set = std::getenv("OPENBLAS_CORETYPE");
      l.why =
          cat("OpenBLAS runs its ", l.core, " kernels",
              set && *set ? cat(" (OPENBLAS_CORETYPE=", set, ")") : std::string(), "; Eigen's AVX-512 code is faster");
      return l;
    }
#endif
    l.use = true;
#else
    l.why = "configured without OpenBLAS";
#endif
    return l;
  }();
  return lib;
}

}  // namespace detail

// What runs host::gemm, for logs and benchmarks: "openblas (SkylakeX)" (its kernels), or "eigen",
// with why where weft was configured with OpenBLAS.
inline std::string gemm_library() {
  const detail::OpenBlas& lib = detail::openblas();
  if (lib.use) return cat("openblas (", lib.core, ")");
  return WEFT_HOST_OPENBLAS ? cat("eigen (", lib.why, ")") : std::string("eigen");
}

// C = alpha op(A) op(B) + beta C on Eigen, whatever the build uses (benchmarks/gemm compares the
// two); arguments as host::gemm's, already checked, m, n, k > 0 and alpha != 0.
template <class T>
void eigen_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  using CMap = Eigen::Map<const Mat, Eigen::Unaligned, Stride>;
  Eigen::Map<Mat, Eigen::Unaligned, Stride> C(c, m, n, Stride(ldc));
  const CMap A(a, ta == Trans::yes ? k : m, ta == Trans::yes ? m : k, Stride(lda));
  const CMap B(b, tb == Trans::yes ? n : k, tb == Trans::yes ? k : n, Stride(ldb));
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

namespace detail {
// One thread's GEMM, arguments checked, m, n, k > 0 and alpha != 0.
template <class T>
void gemm_one(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
              const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
#if WEFT_HOST_OPENBLAS
  constexpr std::int64_t kInt = std::numeric_limits<int>::max();  // OpenBLAS's LP64 sizes
  if (openblas().use && m <= kInt && n <= kInt && k <= kInt && lda <= kInt && ldb <= kInt && ldc <= kInt) {
    const auto op = [](Trans t) { return t == Trans::yes ? CblasTrans : CblasNoTrans; };
    const auto i = [](std::int64_t v) { return static_cast<int>(v); };
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, op(ta), op(tb), i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
    else cblas_dgemm(CblasRowMajor, op(ta), op(tb), i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
    return;
  }
#endif
  eigen_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// With host::set_threads's threads, C's rows split into parts of whole kSplitRows blocks, one GEMM
// each. The libraries compute row blocks of 16, 24 or 48 (Eigen's AVX-512 and AVX2 kernels,
// OpenBLAS's Cooperlake and Haswell ones) and sum each element over k in blocks set by k alone,
// so a part starting at a multiple of 48 rows computes its elements exactly as the whole GEMM does:
// the same bits on any number of threads (tests/device/host/gemm.cpp checks it).
inline constexpr std::int64_t kSplitRows = 48;
}  // namespace detail

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
  if (k == 0 || alpha == T(0)) {
    using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<Mat, Eigen::Unaligned, Eigen::OuterStride<>> C(c, m, n, Eigen::OuterStride<>(ldc));
    if (beta == T(0)) C.setZero();
    else C *= beta;
    return;
  }
  // Whole blocks per part; the last part takes the rows past the last whole block too (a part of a
  // row or two would go to the libraries' matrix-vector path, which sums in another order).
  split(m, detail::kSplitRows, [&](std::int64_t lo, std::int64_t hi) {
    const T* ap = ta == Trans::yes ? a + lo : a + lo * lda;  // op(A)'s rows lo..: A's columns when transposed
    detail::gemm_one(ta, tb, hi - lo, n, k, alpha, ap, lda, b, ldb, beta, c + lo * ldc, ldc);
  });
}

}  // namespace weft::host

// Separate compilation, for builds that want it: Eigen's GEMM is the heaviest code a unit that calls
// a GEMM compiles (about 13% of a model test's or a trainer unit's compile at -O0 with the
// sanitizers), and every such unit compiles it again. A build that defines WEFT_HOST_GEMM_COMPILED=1
// declares eigen_gemm's two instantiations here and compiles them once, in the one unit that
// includes weft/device/host/gemm_instances.hpp. With CMake, link weft::host_gemm, which does both
// (weft's own tests, examples and benchmarks do); an installed weft's user adds the definition and
// that one unit. Header-only use is unchanged: without the definition each unit instantiates them.
#define WEFT_HOST_GEMM_INSTANCES(EXTERN)                                                                            \
  EXTERN template void weft::host::eigen_gemm<float>(weft::Trans, weft::Trans, std::int64_t, std::int64_t,          \
                                                     std::int64_t, float, const float*, std::int64_t, const float*, \
                                                     std::int64_t, float, float*, std::int64_t);                    \
  EXTERN template void weft::host::eigen_gemm<double>(weft::Trans, weft::Trans, std::int64_t, std::int64_t,         \
                                                      std::int64_t, double, const double*, std::int64_t,            \
                                                      const double*, std::int64_t, double, double*, std::int64_t);
#if defined(WEFT_HOST_GEMM_COMPILED) && WEFT_HOST_GEMM_COMPILED
WEFT_HOST_GEMM_INSTANCES(extern)
#endif
