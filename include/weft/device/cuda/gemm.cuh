// GEMM through cuBLASLt, row-major like host::gemm: C = alpha op(A) op(B) + beta C, with op(A) (m, k),
// op(B) (k, n), C (m, n), in f32 (strict fp32 compute: no TF32) or bf16 (fp32 accumulation), and
// the epilogues a transformer needs:
//   none        C = alpha op(A) op(B) + beta C
//   bias        ... + bias (n), broadcast over rows
//   bias_gelu   C = gelu(op(A) op(B) + bias), and aux = the pre-activation (for backward)
//   dgelu       C = (op(A) op(B)) * gelu'(aux): the GELU backward fused into the GEMM that produces
//               the gradient of the GELU output
// cuBLASLt is column-major: the row-major product is computed as C^T = op(B)^T op(A)^T, which is
// the same memory with the operands swapped. gemm_fp8: the FP8 GEMM of ops::ScaledGemm
// (ops/scaled_gemm.cuh), its operands' scales one a tensor or one a row. Include only from .cu
// translation units.
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

    Descriptors desc;
    cublasLtMatmulDesc_t& op = desc.op;
    cublasLtMatrixLayout_t &la = desc.a, &lb = desc.b, &lc = desc.c;

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

    const std::uint32_t al[] = {align(B), align(A), align(C), align(C)};  // cuBLASLt's A, B, C, D
    const Key key{
        static_cast<int>(ta),    static_cast<int>(tb), m,     n,     k,    lda, ldb, ldc, static_cast<int>(type),
        static_cast<int>(ctype), static_cast<int>(e),  al[0], al[1], al[2]};
    const cublasLtMatmulAlgo_t& algo =
        algorithm(key, op, la, lb, lc, al, "cuda::Blas::gemm",
                  "align leading dimensions to 16 bytes (8 bf16 elements), or use Epilogue::none");
    check(cublasLtMatmul(handle_, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &algo, workspace_.data(),
                         workspace_bytes, dev_->stream()),
          "cublasLtMatmul");
  }

  // The FP8 GEMM (sm_90): C (m, n) = alpha (A8 B8^T, each product scaled) + beta C, with A8 (m, k)
  // and B8 (n, k) float8 values, K contiguous (leading dimensions lda, ldb multiples of 16 bytes:
  // the only layout cuBLASLt's FP8 kernels take, "TN"), and their inverse scales on the device:
  // one each (vectors = false), or a vector each, m values for A8's rows and n for B8's (cuBLASLt's
  // outer-vector scale mode). C in bf16 or f32. fast_accum: no periodic promotion of the partial
  // sums (faster, less accurate; for the forward GEMM).
  template <class CT>
  void gemm_fp8(index m, index n, index k, const void* A8, cudaDataType_t a_type, index lda, const float* a_inv,
                const void* B8, cudaDataType_t b_type, index ldb, const float* b_inv, bool vectors, CT* C, index ldc,
                float alpha, float beta, bool fast_accum) {
    static_assert(std::same_as<CT, float> || std::same_as<CT, weft::bf16>,
                  "cuda::Blas::gemm_fp8: C must be f32 or bf16");
    if (m <= 0 || n <= 0 || k <= 0 || lda < k || ldb < k || lda % 16 != 0 || ldb % 16 != 0 || ldc < n)
      throw Error("cuda::Blas::gemm_fp8",
                  cat("m ", m, ", n ", n, ", k ", k, " with lda ", lda, ", ldb ", ldb, ", ldc ", ldc),
                  "pass positive sizes, float8 rows of at least k bytes padded to a multiple of 16, and ldc >= n");
    if (a_type == CUDA_R_8F_E5M2 && b_type == CUDA_R_8F_E5M2)
      throw Error("cuda::Blas::gemm_fp8", "two e5m2 operands",
                  "cast one operand to e4m3 (cuBLASLt has no e5m2 x e5m2)");
    constexpr cudaDataType_t ctype = std::same_as<CT, float> ? CUDA_R_32F : CUDA_R_16BF;
    Descriptors desc;
    cublasLtMatmulDesc_t& op = desc.op;
    cublasLtMatrixLayout_t &la = desc.a, &lb = desc.b, &lc = desc.c;
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "FP8 matmul descriptor");
    // Column-major view: C^T (n x m) = B8 (n x k, stored k x n: transposed) times A8^T (k x m).
    const cublasOperation_t t1 = CUBLAS_OP_T, t2 = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t1, sizeof t1), "transa");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &t2, sizeof t2), "transb");
    const void* first_scale = b_inv;  // cuBLASLt's A is B8
    const void* second_scale = a_inv;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &first_scale, sizeof first_scale),
          "A scale pointer");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &second_scale, sizeof second_scale),
          "B scale pointer");
    const std::int32_t mode =
        vectors ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode), "A scale mode");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode), "B scale mode");
    const std::int8_t fast = fast_accum ? 1 : 0;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), "fast accumulation");
    const auto u = [](index x) { return static_cast<std::uint64_t>(x); };
    check(cublasLtMatrixLayoutCreate(&la, b_type, u(k), u(n), ldb), "layout of B8");
    check(cublasLtMatrixLayoutCreate(&lb, a_type, u(k), u(m), lda), "layout of A8");
    check(cublasLtMatrixLayoutCreate(&lc, ctype, u(n), u(m), ldc), "layout of C");
    const std::uint32_t al[] = {align(B8), align(A8), align(C), align(C)};
    const Key key{-1 - static_cast<int>(fast_accum),
                  static_cast<int>(vectors),
                  m,
                  n,
                  k,
                  lda,
                  ldb,
                  ldc,
                  static_cast<int>(a_type) * 1000 + static_cast<int>(b_type),
                  static_cast<int>(ctype),
                  -1,
                  al[0],
                  al[1],
                  al[2]};
    const cublasLtMatmulAlgo_t& algo = algorithm(key, op, la, lb, lc, al, "cuda::Blas::gemm_fp8",
                                                 "the FP8 GEMM needs sm_90 or newer, and C's rows 16-byte aligned");
    check(cublasLtMatmul(handle_, op, &alpha, B8, la, A8, lb, &beta, C, lc, C, lc, &algo, workspace_.data(),
                         workspace_bytes, dev_->stream()),
          "cublasLtMatmul (FP8)");
  }

 private:
  // A matmul's descriptor and its three layouts, destroyed on the way out.
  struct Descriptors {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    Descriptors() = default;
    Descriptors(const Descriptors&) = delete;
    Descriptors& operator=(const Descriptors&) = delete;
    ~Descriptors() {
      if (op) cublasLtMatmulDescDestroy(op);
      for (auto* l : {a, b, c})
        if (l) cublasLtMatrixLayoutDestroy(l);
    }
  };
  using Key = std::tuple<int, int, index, index, index, index, index, index, int, int, int, std::uint32_t,
                         std::uint32_t, std::uint32_t>;
  static std::uint32_t align(const void* p) {
    std::uint32_t a = 256;
    while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
    return a;
  }
  // The heuristic's choice for a descriptor, kept by key (a training step asks for the same few
  // GEMMs every time); `where` and `fix` name a refusal where cuBLASLt has none.
  const cublasLtMatmulAlgo_t& algorithm(const Key& key, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                        cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const std::uint32_t* al,
                                        const char* where, const char* fix) {
    auto cached = algos_.find(key);
    if (cached != algos_.end()) return cached->second;
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
      throw Error(where,
                  cat("cuBLASLt has no algorithm for m ", std::get<2>(key), ", n ", std::get<3>(key), ", k ",
                      std::get<4>(key), " with these types, epilogue and alignment"),
                  fix);
    return algos_.emplace(key, heuristic.algo).first->second;
  }

  Cuda* dev_;
  Allocation workspace_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace weft::cuda
