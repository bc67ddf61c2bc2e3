// Layouts do not change the numbers: the Gpt loss and every global gradient under tensor degrees 1,
// 2 and 4, with and without sequence parallelism, under each recompute policy, equal the degree-1
// result within 1e-12 relative in double (reassociation of sums only); recompute policies agree
// bitwise; initialization gathers bit for bit.
#include <doctest/doctest.h>

#include "equivalence.hpp"

using namespace weft;
using test::run_gpt;

TEST_CASE("initialization does not depend on the tensor degree (bitwise)") {
  const auto ref = run_gpt<double, false, recompute::None>(1);
  for (int tp : {2, 4}) {
    const auto run = run_gpt<double, false, recompute::None>(tp);
    for (const auto& [name, v] : ref.values) CHECK_MESSAGE(run.values.at(name) == v, name, " differs at tp ", tp);
  }
}

TEST_CASE_TEMPLATE("tensor-parallel Gpt equals one rank within 1e-12 in double", Policy, recompute::None,
                   recompute::Full, recompute::Selective) {
  const auto ref = run_gpt<double, false, recompute::None>(1);
  CHECK(ref.loss > 3.5);  // about log(65) = 4.17 for a near-uniform start
  CHECK(ref.loss < 4.8);
  for (int tp : {1, 2, 4}) {
    std::string where;
    const double e = test::worst_error(run_gpt<double, false, Policy>(tp), ref, &where);
    CHECK_MESSAGE(e <= 1e-12, "tp ", tp, " without SP: ", where, " off by ", e);
    const double es = test::worst_error(run_gpt<double, true, Policy>(tp), ref, &where);
    CHECK_MESSAGE(es <= 1e-12, "tp ", tp, " with SP: ", where, " off by ", es);
    MESSAGE("tp ", tp, ": worst relative error ", e, " without SP, ", es, " with SP");
  }
}

TEST_CASE("recompute policies give bitwise identical gradients") {
  for (int tp : {1, 2}) {
    const auto none = run_gpt<double, true, recompute::None>(tp);
    const auto full = run_gpt<double, true, recompute::Full>(tp);
    const auto sel = run_gpt<double, true, recompute::Selective>(tp);
    CHECK(full.loss == none.loss);
    CHECK(sel.loss == none.loss);
    for (const auto& [name, g] : none.grads) {
      CHECK_MESSAGE(full.grads.at(name) == g, name);
      CHECK_MESSAGE(sel.grads.at(name) == g, name);
    }
  }
}
