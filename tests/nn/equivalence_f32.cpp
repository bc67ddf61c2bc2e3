// The same equivalence in float: within 1e-5 relative (float sums of a few hundred terms in another
// order differ by ~1e-7 relative; 1e-5 leaves room for the softmax and LayerNorm amplification).
#include <doctest/doctest.h>

#include "equivalence.hpp"

using namespace weft;
using test::run_gpt;

TEST_CASE_TEMPLATE("tensor-parallel Gpt equals one rank within 1e-5 in float", Policy, recompute::None, recompute::Full,
                   recompute::Selective) {
  const auto ref = run_gpt<double, false, recompute::None>(1);
  const auto ref32 = run_gpt<float, false, recompute::None>(1);
  CHECK(test::worst_error(ref32, ref) <= 1e-5);  // float against double at one rank
  for (int tp : {1, 2, 4}) {
    std::string where;
    const double e = test::worst_error(run_gpt<float, false, Policy>(tp), ref32, &where);
    CHECK_MESSAGE(e <= 1e-5, "tp ", tp, " without SP: ", where, " off by ", e);
    const double es = test::worst_error(run_gpt<float, true, Policy>(tp), ref32, &where);
    CHECK_MESSAGE(es <= 1e-5, "tp ", tp, " with SP: ", where, " off by ", es);
    MESSAGE("float tp ", tp, ": worst relative error ", e, " without SP, ", es, " with SP");
  }
}
