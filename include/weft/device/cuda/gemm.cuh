// GEMM through cuBLASLt, row-major like host::gemm: C = alpha op(A) op(B) + beta C, with op(A) (m, k),
// op(B) (k, n), C (m, n), in f32 (strict fp32 compute: no TF32) or bf16 (fp32 accumulation), and
// the epilogues a transformer needs:
//   none        C = alpha op(A) op(B) + beta C
//   bias        ... + bias (n), broadcast over rows
//   bias_gelu   C = gelu(op(A) op(B) + bias), and aux = the pre-activation (for backward)
//   dgelu       C = (op(A) op(B)) * gelu'(aux): the GELU backward fused into the GEMM that produces
//               the gradient of the GELU output
// cuBLASLt is column-major: the row-major product is computed as C^T = op(B)^T op(A)^T, which is
// the same memory with the operands swapped. Include only from .cu translation units.
#pragma once

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "weft/device/cuda/kernels/common.cuh"
#include "weft/device/host/gemm.hpp"

namespace weft::cuda {

enum class Epilogue { none, bias, bias_gelu, dgelu };

class Blas {
 public:
  static constexpr index workspace_bytes = 32 << 20;

  explicit Blas(Cuda& d) : dev_(&d), workspace_(d.allocate(workspace_bytes, Category::communication)) {
    check(cublasLtCreate(&handle_), "cublasLtCreate");
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  ~Blas() { (void)cublasLtDestroy(handle_); }

  // C may be T, or float under bf16 operands (parameter gradients accumulated in f32).
  template <Activation T, Activation CT = T>
  void gemm(host::Trans ta, host::Trans tb, index m, index n, index k, const T* A, index lda, const T* B, index ldb,
            std::type_identity_t<CT>* C, index ldc, float alpha = 1.0f, float beta = 0.0f, Epilogue e = Epilogue::none,
            const T* bias = nullptr, T* aux = nullptr, index ldaux = 0) {
    const index a_cols = ta == host::Trans::yes ? m : k, b_cols = tb == host::Trans::yes ? k : n;
    if (m <= 0 || n <= 0 || k <= 0 || lda < a_cols || ldb < b_cols || ldc < n)
      throw Error("cuda::Blas::gemm",
                  cat("m ", m, ", n ", n, ", k ", k, " with lda ", lda, ", ldb ", ldb, ", ldc ", ldc,
                      " (need lda >= ", a_cols, ", ldb >= ", b_cols, ", ldc >= ", n, ")"),
                  "pass positive sizes and leading dimensions at least the row length");
    if ((e == Epilogue::bias || e == Epilogue::bias_gelu) && !bias)
      throw Error("cuda::Blas::gemm", "a bias epilogue without a bias", "pass the bias (n values)");
    if ((e == Epilogue::bias_gelu || e == Epilogue::dgelu) && (!aux || ldaux < n))
      throw Error("cuda::Blas::gemm", cat("a GELU epilogue with aux ", aux ? "given" : "missing", " and ldaux ", ldaux),
                  cat("pass the pre-activation buffer (m, n) with ldaux >= ", n));
    static_assert(std::same_as<CT, T> || std::same_as<CT, float>, "cuda::Blas::gemm: C must be T or float");
    constexpr cudaDataType_t type = std::same_as<T, float> ? CUDA_R_32F : CUDA_R_16BF;
    constexpr cudaDataType_t ctype = std::same_as<CT, float> ? CUDA_R_32F : CUDA_R_16BF;

    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    struct Cleanup {
      cublasLtMatmulDesc_t& op;
      cublasLtMatrixLayout_t &la, &lb, &lc;
      ~Cleanup() {
        if (op) cublasLtMatmulDescDestroy(op);
        for (auto* l : {la, lb, lc})
          if (l) cublasLtMatrixLayoutDestroy(l);
      }
    } cleanup{op, la, lb, lc};

    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    // Column-major view: C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m).
    const cublasOperation_t t1 = tb == host::Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t t2 = ta == host::Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t1, sizeof t1), "transa");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &t2, sizeof t2), "transb");
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (e == Epilogue::bias) epi = CUBLASLT_EPILOGUE_BIAS;
    if (e == Epilogue::bias_gelu) epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (e == Epilogue::dgelu) epi = CUBLASLT_EPILOGUE_DGELU;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue");
    if (bias) {
      const void* b = bias;
      check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b), "bias pointer");
    }
    if (aux) {
      void* x = aux;
      const std::int64_t ld = ldaux;
      check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x, sizeof x), "aux pointer");
      check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld), "aux ld");
    }
    // Layouts of the column-major operands: first = B, second = A.
    const auto u = [](index x) { return static_cast<std::uint64_t>(x); };
    check(cublasLtMatrixLayoutCreate(&la, type, t1 == CUBLAS_OP_N ? u(n) : u(k), t1 == CUBLAS_OP_N ? u(k) : u(n), ldb),
          "layout of B");
    check(cublasLtMatrixLayoutCreate(&lb, type, t2 == CUBLAS_OP_N ? u(k) : u(m), t2 == CUBLAS_OP_N ? u(m) : u(k), lda),
          "layout of A");
    check(cublasLtMatrixLayoutCreate(&lc, ctype, u(n), u(m), ldc), "layout of C");

    // The heuristic's choice is kept per shape, types, epilogue and alignment: a training step asks
    // for the same few GEMMs every time.
    const auto align = [](const void* p) {
      std::uint32_t a = 256;
      while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
      return a;
    };
    const std::uint32_t al[] = {align(B), align(A), align(C), align(C)};  // cuBLASLt's A, B, C, D
    const Key key{
        static_cast<int>(ta),    static_cast<int>(tb), m,     n,     k,    lda, ldb, ldc, static_cast<int>(type),
        static_cast<int>(ctype), static_cast<int>(e),  al[0], al[1], al[2]};
    auto cached = algos_.find(key);
    if (cached == algos_.end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      check(cublasLtMatmulPreferenceCreate(&pref), "preference");
      const std::uint64_t ws = workspace_bytes;
      cublasStatus_t st =
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      // The heuristic assumes 256-byte aligned operands unless told otherwise; views into a unit's
      // flat buffer (and slices of it) can be less aligned, so state each pointer's alignment.
      const cublasLtMatmulPreferenceAttributes_t which[] = {
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
      for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
        st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
      cublasLtMatmulHeuristicResult_t heuristic{};
      int found = 0;
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(handle_, op, la, lb, lc, lc, pref, 1, &heuristic, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      check(st, "algorithm heuristic");
      if (found == 0)
        throw Error(
            "cuda::Blas::gemm",
            cat("cuBLASLt has no algorithm for m ", m, ", n ", n, ", k ", k, " with this epilogue and alignment"),
            "align leading dimensions to 16 bytes (8 bf16 elements), or use Epilogue::none");
      cached = algos_.emplace(key, heuristic.algo).first;
    }
    check(cublasLtMatmul(handle_, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &cached->second, workspace_.data(),
                         workspace_bytes, dev_->stream()),
          "cublasLtMatmul");
  }

 private:
  using Key = std::tuple<int, int, index, index, index, index, index, index, int, int, int, std::uint32_t,
                         std::uint32_t, std::uint32_t>;
  Cuda* dev_;
  Allocation workspace_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace weft::cuda
