#include <doctest/doctest.h>

#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/shape.hpp"

TEST_CASE("Error composes where: what fix and keeps the parts") {
  const weft::Error e("Mesh", weft::cat("tensor degree ", 5, " does not divide ", 12, " heads"),
                      "use 1, 2, 3, 4, 6 or 12");
  CHECK(std::string(e.what()) == "Mesh: tensor degree 5 does not divide 12 heads; use 1, 2, 3, 4, 6 or 12");
  CHECK(e.where() == "Mesh");
  CHECK(e.problem() == "tensor degree 5 does not divide 12 heads");
  CHECK(e.fix() == "use 1, 2, 3, 4, 6 or 12");
}

TEST_CASE("Error::within places an error under the named parts it was raised in, innermost last") {
  const weft::Error e("Linear<RowParallel>'s forward GEMM", "the tensor holds an infinite or NaN value", "find it");
  CHECK(e.path().empty());
  const weft::Error at = e.within("proj").within("attn").within("h3");
  CHECK(at.path() == "h3.attn.proj");
  CHECK(std::string(at.what()) ==
        "h3.attn.proj: Linear<RowParallel>'s forward GEMM: the tensor holds an infinite or NaN value; find it");
  CHECK(at.where() == e.where());  // the parts stay as they were
  CHECK(at.problem() == e.problem());
  CHECK(at.fix() == e.fix());
}

TEST_CASE("join separates values") {
  CHECK(weft::join(std::vector{1, 2, 4}) == "1, 2, 4");
  CHECK(weft::join(std::vector<int>{}) == "");
}

TEST_CASE("Shape: extents outer/inner products negative dims") {
  const weft::Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.outer(1) == 2);
  CHECK(s.inner(1) == 4);
  CHECK(s.normalize_dim(-1) == 2);
  CHECK(s.normalize_dim(-3) == 0);
  CHECK_THROWS_WITH_AS(s.normalize_dim(3), "Shape: dim 3 is out of range for a rank-3 tensor; use a dim in [-3, 3)",
                       weft::Error);
  CHECK_THROWS_WITH_AS(s.normalize_dim(-4), doctest::Contains("dim -4 is out of range"), weft::Error);
  CHECK_THROWS_AS((weft::Shape{1, 2, 3, 4, 5, 6, 7}), weft::Error);
  CHECK_THROWS_WITH_AS((weft::Shape{2, -1}), "Shape: extent -1 is negative; use extents >= 0", weft::Error);
  static_assert(weft::Shape{4, 6}.normalize_dim(-1) == 1);  // usable in constant expressions
}
