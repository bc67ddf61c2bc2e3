// cuBLASLt GEMM against the host GEMM in double: every transpose combination, sizes that are not
// multiples of any tile, beta accumulation, and the bias, bias + GELU (with the saved
// pre-activation) and GELU-backward epilogues. Tolerances: f32 1e-5 relative (strict fp32 compute);
// bf16 1e-2 (inputs are exact in both; fp32 accumulation, one rounding of the output to 8 bits).
#include <doctest/doctest.h>

#include "support.cuh"
#include "weft/device/cuda/gemm.cuh"
#include "weft/device/host/gemm.hpp"
#include "weft/ops/all.hpp"

using namespace weft;
using namespace weft::test;
using host::Trans;
using V = std::vector<double>;

namespace {

struct Case {
  std::int64_t m, n, k;
};

template <class T>
void check_gemm(Cuda& d, weft::cuda::Blas& blas, Trans ta, Trans tb, Case c, weft::cuda::Epilogue e, float beta) {
  CAPTURE(c.m);
  CAPTURE(c.n);
  CAPTURE(c.k);
  CAPTURE(static_cast<int>(e));
  const std::int64_t lda = ta == Trans::yes ? c.m : c.k, ldb = tb == Trans::yes ? c.k : c.n, ldc = c.n;
  const auto A = random<T>(static_cast<std::size_t>((ta == Trans::yes ? c.k : c.m) * lda), 1);
  const auto B = random<T>(static_cast<std::size_t>((tb == Trans::yes ? c.n : c.k) * ldb), 2);
  const auto C0 = random<T>(static_cast<std::size_t>(c.m * ldc), 3);
  const auto bias = random<T>(static_cast<std::size_t>(c.n), 4);
  const auto aux_in = random<T>(static_cast<std::size_t>(c.m * c.n), 5);
  DeviceVec<T> gA(d, A), gB(d, B), gbias(d, bias);
  DeviceVec<T> gC = beta != 0.0f ? DeviceVec<T>(d, C0) : DeviceVec<T>(d, C0.size());
  DeviceVec<T> gaux = e == weft::cuda::Epilogue::dgelu ? DeviceVec<T>(d, aux_in) : DeviceVec<T>(d, aux_in.size());
  const bool uses_aux = e == weft::cuda::Epilogue::bias_gelu || e == weft::cuda::Epilogue::dgelu;
  blas.gemm<T>(ta, tb, c.m, c.n, c.k, gA.data(), lda, gB.data(), ldb, gC.data(), ldc, 1.0f, beta, e,
               e == weft::cuda::Epilogue::bias || e == weft::cuda::Epilogue::bias_gelu ? gbias.data() : nullptr,
               uses_aux ? gaux.data() : nullptr, uses_aux ? c.n : 0);
  // Reference in double.
  const V a = widen(A), b = widen(B), bi = widen(bias), ax = widen(aux_in);
  V ref = widen(C0);
  host::gemm<double>(ta, tb, c.m, c.n, c.k, 1.0, a.data(), lda, b.data(), ldb, beta, ref.data(), ldc);
  V pre;
  if (e == weft::cuda::Epilogue::bias || e == weft::cuda::Epilogue::bias_gelu)
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j)
        ref[static_cast<std::size_t>(i * c.n + j)] += bi[static_cast<std::size_t>(j)];
  if (e == weft::cuda::Epilogue::bias_gelu) {
    pre = ref;
    host::gelu_forward(ref.data(), pre.data(), static_cast<std::int64_t>(ref.size()));
  }
  if (e == weft::cuda::Epilogue::dgelu) {
    const V prod = ref;
    host::gelu_backward(ref.data(), ax.data(), prod.data(), static_cast<std::int64_t>(ref.size()));
  }
  const double tol = tolerance<T>(1e-2);
  CHECK(rel_error(gC.get(d), ref) <= tol);
  if (e == weft::cuda::Epilogue::bias_gelu) CHECK(rel_error(gaux.get(d), pre) <= tol);
}

}  // namespace

TEST_CASE_TEMPLATE("cuBLASLt GEMM matches the host GEMM", T, float, bf16) {
  Cuda& d = gpu();
  weft::cuda::Blas blas(d);
  // bf16 operands need 16-byte aligned rows for the tensor-core algorithms: odd sizes for f32 only.
  const std::vector<Case> cases =
      std::is_same_v<T, float> ? std::vector<Case>{{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {128, 96, 131}, {512, 768, 768}}
                               : std::vector<Case>{{8, 8, 8}, {40, 24, 72}, {128, 96, 136}, {512, 768, 768}};
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (const Case& c : cases) {
        check_gemm<T>(d, blas, ta, tb, c, weft::cuda::Epilogue::none, 0.0f);
        check_gemm<T>(d, blas, ta, tb, c, weft::cuda::Epilogue::none, 1.0f);
      }
  for (const Case& c : std::vector<Case>{{64, 96, 40}, {256, 3072, 768}}) {
    check_gemm<T>(d, blas, Trans::no, Trans::yes, c, weft::cuda::Epilogue::bias, 0.0f);
    check_gemm<T>(d, blas, Trans::no, Trans::yes, c, weft::cuda::Epilogue::bias_gelu, 0.0f);
    check_gemm<T>(d, blas, Trans::no, Trans::no, c, weft::cuda::Epilogue::dgelu, 0.0f);
  }
}

TEST_CASE("cuBLASLt GEMM rejects bad sizes with the values") {
  Cuda& d = gpu();
  weft::cuda::Blas blas(d);
  CHECK_THROWS_WITH_AS(blas.gemm<float>(Trans::no, Trans::no, 4, 4, 4, nullptr, 3, nullptr, 4, nullptr, 4),
                       doctest::Contains("m 4, n 4, k 4 with lda 3"), Error);
  CHECK_THROWS_WITH_AS(blas.gemm<float>(Trans::no, Trans::no, 4, 4, 4, nullptr, 4, nullptr, 4, nullptr, 4, 1, 0,
                                        weft::cuda::Epilogue::bias_gelu, nullptr, nullptr, 0),
                       doctest::Contains("a bias epilogue without a bias"), Error);
}
