// The shared error metrics (support/error.hpp) and the gradient check fail on NaN: a NaN output, a NaN
// reference or an infinity scores infinity, never 0.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "support/error.hpp"
#include "support/gradcheck.hpp"

using namespace weft;

TEST_CASE("error metrics: infinity for NaN or an infinity on either side, the plain maximum otherwise") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK(test::worse(0.5, 0.25) == 0.5);
  CHECK(test::worse(0.25, 0.5) == 0.5);
  CHECK(test::worse(0.0, nan) == inf);
  CHECK(test::worse(nan, 0.0) == inf);
  CHECK(test::worse(test::worse(0.0, nan), 0.1) == inf);  // a NaN early in the loop is not forgotten
  CHECK(test::worse(0.0, inf) == inf);

  const std::vector<double> want{1.0, -2.0, 4.0};
  CHECK(test::max_abs_error(std::vector<double>{1.0, -2.5, 4.0}, want) == 0.5);
  CHECK(test::rel_error(std::vector<double>{1.0, -2.5, 4.0}, want) == 0.125);  // 0.5 / max |want|
  for (std::size_t i = 0; i < want.size(); ++i) {
    for (double bad : {nan, inf, -inf}) {
      std::vector<double> got = want;
      got[i] = bad;
      CHECK(test::max_abs_error(got, want) == inf);
      CHECK(test::rel_error(got, want) == inf);
      CHECK(test::max_abs_error(want, got) == inf);  // a broken reference fails too
      CHECK(test::rel_error(want, got) == inf);
    }
  }
  CHECK(test::max_abs_error(std::vector<float>{1.0f, std::nanf("")}, std::vector<double>{1.0, 0.0}) == inf);
  CHECK(test::max_abs_error(std::vector<double>{1.0}, want) == inf);  // sizes differ
  CHECK(test::rel_error(std::vector<double>{1.0, -2.0}, want) == inf);
}

TEST_CASE("gradcheck: a NaN analytic gradient is the worst error, not 0") {
  // L(x) = sum x^2 / 2, gradient x: exact except the one element made NaN.
  std::vector<double> x{0.3, -1.2, 2.0, 0.7};
  const auto loss = [&] {
    double l = 0;
    for (double v : x) l += v * v / 2;
    return l;
  };
  std::vector<double> analytic = x;
  CHECK(test::gradcheck(x, analytic, loss).worst < 1e-9);
  analytic[2] = std::numeric_limits<double>::quiet_NaN();
  const auto r = test::gradcheck(x, analytic, loss);
  CHECK(r.checked == 4);
  CHECK(r.worst == std::numeric_limits<double>::infinity());
}
