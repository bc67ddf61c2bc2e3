// Host GEMM against a naive triple loop in double, for every transpose combination, padded
// leading dimensions, beta accumulation and sizes that are not multiples of any block size.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "support/error.hpp"
#include "weft/core/philox.hpp"
#include "weft/device/host/gemm.hpp"

using namespace weft;
using host::Trans;

namespace {

template <class T>
std::vector<T> random(std::size_t n, std::uint64_t salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(normal(salt, 0, i));
  return v;
}

// Worst |gemm - reference| / (|alpha| sum_k |a b| + |beta c|): the error relative to the size of
// the terms, which is what floating-point summation bounds.
template <class T>
double check(Trans ta, Trans tb, int m, int n, int k, double alpha, double beta, int pad) {
  const int a_rows = ta == Trans::yes ? k : m, a_cols = ta == Trans::yes ? m : k;
  const int b_rows = tb == Trans::yes ? n : k, b_cols = tb == Trans::yes ? k : n;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  const auto A = random<T>(static_cast<std::size_t>(a_rows * lda), 1);
  const auto B = random<T>(static_cast<std::size_t>(b_rows * ldb), 2);
  auto C = random<T>(static_cast<std::size_t>(m * ldc), 3);
  const auto C0 = C;
  host::gemm<T>(ta, tb, m, n, k, static_cast<T>(alpha), A.data(), lda, B.data(), ldb, static_cast<T>(beta), C.data(),
                ldc);
  double worst = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < ldc; ++j) {
      const auto at = [&](int r, int c) -> double {
        return ta == Trans::yes ? A[static_cast<std::size_t>(c * lda + r)] : A[static_cast<std::size_t>(r * lda + c)];
      };
      const auto bt = [&](int r, int c) -> double {
        return tb == Trans::yes ? B[static_cast<std::size_t>(c * ldb + r)] : B[static_cast<std::size_t>(r * ldb + c)];
      };
      const auto idx = static_cast<std::size_t>(i * ldc + j);
      if (j >= n) {  // padding is never written
        if (C[idx] != C0[idx]) return std::numeric_limits<double>::infinity();
        continue;
      }
      double ref = beta * static_cast<double>(C0[idx]), scale = std::fabs(beta * static_cast<double>(C0[idx]));
      for (int p = 0; p < k; ++p) {
        ref += alpha * at(i, p) * bt(p, j);
        scale += std::fabs(alpha * at(i, p) * bt(p, j));
      }
      worst = test::worse(worst, std::fabs(static_cast<double>(C[idx]) - ref) / std::max(scale, 1e-300));
    }
  return worst;
}

}  // namespace

TEST_CASE_TEMPLATE("gemm matches the naive loop in double", T, double, float) {
  // Tolerance: a sum of k products in T has error at most about k * eps relative to the sum of |terms|;
  // with k <= 131 that is 3e-14 (double) and 1.6e-5 (float). Blocked summation does much better.
  const double tol = std::is_same_v<T, double> ? 1e-13 : 2e-5;
  double worst = 0;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (auto [m, n, k] : {std::array{1, 1, 1}, std::array{7, 5, 3}, std::array{33, 17, 65}, std::array{64, 96, 131}})
        for (double beta : {0.0, 1.0, -0.5})
          for (int pad : {0, 3}) {
            const double e = check<T>(ta, tb, m, n, k, 1.25, beta, pad);
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(beta);
            CHECK(e <= tol);
            worst = test::worse(worst, e);
          }
  MESSAGE("worst relative error ", worst);
}

TEST_CASE("gemm with beta 0 does not read C and k = 0 scales C") {
  std::vector<double> A{1, 2, 3, 4}, B{5, 6, 7, 8}, C(4, std::numeric_limits<double>::quiet_NaN());
  host::gemm<double>(Trans::no, Trans::no, 2, 2, 2, 1.0, A.data(), 2, B.data(), 2, 0.0, C.data(), 2);
  CHECK(C == std::vector<double>{19, 22, 43, 50});  // closed form: [[1,2],[3,4]] x [[5,6],[7,8]]
  host::gemm<double>(Trans::no, Trans::no, 2, 2, 0, 1.0, A.data(), 2, B.data(), 2, 2.0, C.data(), 2);
  CHECK(C == std::vector<double>{38, 44, 86, 100});
}

TEST_CASE("gemm rejects bad sizes with the values") {
  std::vector<float> x(16);
  CHECK_THROWS_WITH_AS(
      host::gemm<float>(Trans::no, Trans::no, 4, 4, 4, 1.f, x.data(), 3, x.data(), 4, 0.f, x.data(), 4),
      "host::gemm: m 4, n 4, k 4 with lda 3, ldb 4, ldc 4 (need lda >= 4, ldb >= 4, ldc >= 4); pass "
      "non-negative sizes and leading dimensions at least the row length",
      Error);
}

TEST_CASE("host GEMM: the same bits on more threads, and from four thread ranks at once") {
  // Shapes of a training step (an activation times a weight, its input gradient, a weight
  // gradient); the reference is one thread, one call at a time.
  struct Case {
    Trans ta, tb;
    int m, n, k;
  };
  const Case cases[] = {{Trans::no, Trans::yes, 300, 700, 257},
                        {Trans::no, Trans::no, 300, 257, 700},
                        {Trans::yes, Trans::no, 700, 257, 300}};
  for (const Case& c : cases) {
    const int lda = c.ta == Trans::yes ? c.m : c.k, ldb = c.tb == Trans::yes ? c.k : c.n;
    const auto size = [](int r, int s) { return static_cast<std::size_t>(r) * static_cast<std::size_t>(s); };
    const auto run = [&](const std::vector<float>& A, const std::vector<float>& B) {
      std::vector<float> C(size(c.m, c.n));
      host::gemm<float>(c.ta, c.tb, c.m, c.n, c.k, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), c.n);
      return C;
    };
    // Each rank its own inputs, so that ranks sharing a buffer inside the library would show.
    std::vector<std::vector<float>> A, B, one;
    for (std::uint64_t r = 0; r < 4; ++r) {
      A.push_back(random<float>(size(c.m, c.k), 10 + r));
      B.push_back(random<float>(size(c.k, c.n), 20 + r));
      one.push_back(run(A.back(), B.back()));
    }
    // One rank on 2 and 4 threads (host::set_threads: C's rows split in blocks of 48): the same
    // bits as one thread, whichever library runs.
    for (int t : {2, 4}) {
      host::set_threads(t);
      CHECK_MESSAGE(run(A[0], B[0]) == one[0], t, " threads on ", host::gemm_library());
    }
    host::set_threads(1);
    std::vector<int> wrong(4, 0);
    std::vector<std::thread> ranks;
    for (std::size_t r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        for (int rep = 0; rep < 20; ++rep) wrong[r] += run(A[r], B[r]) != one[r];
      });
    for (std::thread& t : ranks) t.join();
    CHECK(wrong == std::vector<int>(4, 0));
  }
}

TEST_CASE("host GEMM: OpenBLAS unless it runs AVX2 kernels where Eigen has AVX-512 code") {
  // tests/CMakeLists.txt runs this case again with OPENBLAS_CORETYPE unset and set to Haswell.
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string set = before ? before : "";
  const std::string library = host::gemm_library();
  MESSAGE("host GEMM: ", library, "; OPENBLAS_CORETYPE ", before ? set : "unset");
  if (!WEFT_HOST_OPENBLAS) {
    CHECK(library == "eigen");
  } else if (before == nullptr) {
    // OpenBLAS's own choice: its AVX-512 kernels on a CPU with AVX-512 (where Eigen may have them
    // too), otherwise what Eigen has no answer to.
    CHECK(library.starts_with("openblas ("));
  } else if (set == "Haswell") {
#if defined(EIGEN_VECTORIZE_AVX512)
    // AVX2 kernels against Eigen's AVX-512 code: Eigen, and the message says why.
    CHECK(library ==
          "eigen (OpenBLAS runs its Haswell kernels (OPENBLAS_CORETYPE=Haswell); Eigen's AVX-512 code is faster)");
#else
    CHECK(library == "openblas (Haswell)");
#endif
  }
}

TEST_CASE("host GEMM: a serial OpenBLAS build found at run time leaves GEMMs on Eigen") {
  // tests/CMakeLists.txt runs this case again with Debian's serial build (libopenblas0-serial) first
  // on the library path and WEFT_TEST_OPENBLAS=serial: that build shares its packing buffers between
  // callers without locks, and thread ranks calling it at once corrupted each other's results.
  const char* expect = std::getenv("WEFT_TEST_OPENBLAS");
  const std::string library = host::gemm_library();
  MESSAGE("host GEMM: ", library, "; WEFT_TEST_OPENBLAS ", std::string(expect ? expect : "unset"));
  if (!WEFT_HOST_OPENBLAS) {
    CHECK(library == "eigen");
  } else if (expect && std::string(expect) == "serial") {
    CHECK(library == "eigen (OpenBLAS is a serial build, not safe with thread ranks)");
  } else {
    CHECK(library.find("serial build") == std::string::npos);  // the build's own (threaded) OpenBLAS
  }
}
