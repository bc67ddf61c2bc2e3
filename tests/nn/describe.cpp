// describe(): the plan computed from the types equals what a run does, collective by collective.
#include <doctest/doctest.h>

#include "equivalence.hpp"
#include "weft/nn/describe.hpp"

using namespace weft;
using namespace weft::nn;

namespace {

// Totals per op on the tensor axis, forward plus backward, from the plan.
template <bool SP, class R>
threads::Counters planned(int tp) {
  threads::Counters c;
  for (const PlanRow& row : describe_rows<double, SP, R>(test::tiny_config(), 2, {.tensor_degree = tp}))
    for (const auto* steps : {&row.forward, &row.backward})
      for (const PlanStep& st : *steps) {
        if (!communicates(st.collective) || st.axis != Axis::tensor) continue;
        const auto op = static_cast<std::size_t>(st.collective == Collective::all_reduce       ? threads::Op::all_reduce
                                                 : st.collective == Collective::all_gather     ? threads::Op::all_gather
                                                 : st.collective == Collective::reduce_scatter ? threads::Op::reduce_scatter
                                                                                               : threads::Op::all_to_all);
        c.calls[op] += 1;
        c.bytes[op] += static_cast<std::uint64_t>(st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in);
      }
  return c;
}

template <bool SP, class R>
void check_plan_matches_run(int tp) {
  const threads::Counters want = planned<SP, R>(tp);
  const threads::Counters ran = test::run_gpt<double, SP, R>(tp).tensor_ops;
  for (std::size_t op = 0; op < threads::kOps; ++op) {
    if (op == static_cast<std::size_t>(threads::Op::split)) continue;
    CHECK_MESSAGE(ran.calls[op] == want.calls[op], std::string(threads::name(static_cast<threads::Op>(op))), " tp ", tp, " SP ", SP);
    CHECK_MESSAGE(ran.bytes[op] == want.bytes[op], std::string(threads::name(static_cast<threads::Op>(op))), " tp ", tp, " SP ", SP);
  }
}

}  // namespace

TEST_CASE("the plan from describe equals the collectives a forward and backward run") {
  for (int tp : {2, 4}) {
    check_plan_matches_run<false, recompute::None>(tp);
    check_plan_matches_run<true, recompute::None>(tp);
    check_plan_matches_run<true, recompute::Full>(tp);
    check_plan_matches_run<false, recompute::Selective>(tp);
  }
}

TEST_CASE("describe prints every layer with its layouts and collectives") {
  const std::string d = describe<double, false>(test::tiny_config(), 2, {.tensor_degree = 2});
  CHECK(d.find("h1.mlp.fc (ColumnParallel, GELU)") != std::string::npos);
  CHECK(d.find("all_reduce(tensor) 8192 B") != std::string::npos);  // (2, 16, 32) doubles
  CHECK(d.find("LM head (tied, vocab-parallel: 33 of 65 rows)") != std::string::npos);
  MESSAGE(d);
}
