// describe(): the plan computed from the types equals what a run does, collective by collective.
#include <doctest/doctest.h>

#include "equivalence.hpp"
#include "weft/nn/describe.hpp"
#include "weft/optim/data_parallel.hpp"

using namespace weft;
using namespace weft::nn;

namespace {

// Totals per op on the tensor axis, forward plus backward, from the plan.
template <bool SP, class R>
threads::Counters planned(int tp) {
  threads::Counters c;
  for (const CommRow& row :
       describe_rows<gpt2::Model<double, SP, R, Meta<Host>>>(test::tiny_config(), 2, {.tensor_degree = tp}))
    for (const auto* steps : {&row.forward, &row.backward})
      for (const CommStep& st : *steps) {
        if (!communicates(st.collective) || st.axis != Axis::tensor) continue;
        const auto op =
            static_cast<std::size_t>(st.collective == Collective::all_reduce       ? threads::Op::all_reduce
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
    CHECK_MESSAGE(ran.calls[op] == want.calls[op], std::string(threads::name(static_cast<threads::Op>(op))), " tp ", tp,
                  " SP ", SP);
    CHECK_MESSAGE(ran.bytes[op] == want.bytes[op], std::string(threads::name(static_cast<threads::Op>(op))), " tp ", tp,
                  " SP ", SP);
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

TEST_CASE("the plan's per-step rows equal what the data-parallel step runs on the tensor axis") {
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      std::uint64_t planned_calls = 0, planned_bytes = 0;
      const auto rows = sp ? describe_rows<gpt2::Model<double, true, recompute::None, Meta<Host>>>(
                                 test::tiny_config(), 2, {.tensor_degree = tp})
                           : describe_rows<gpt2::Model<double, false, recompute::None, Meta<Host>>>(
                                 test::tiny_config(), 2, {.tensor_degree = tp});
      for (const CommRow& row : rows)
        for (const CommStep& st : row.step) {
          REQUIRE(st.collective == Collective::all_reduce);
          planned_calls += st.axis == Axis::tensor ? 1 : 0;
          planned_bytes += st.axis == Axis::tensor ? static_cast<std::uint64_t>(st.bytes_in) : 0;
        }
      threads::Counters ran;
      std::mutex mu;
      run_threads(tp, [&](ThreadComm& world) {
        Mesh mesh{world, {.tensor = tp}};
        Host h;
        std::vector<std::int32_t> tokens, targets;
        test::tiny_batch(2, test::tiny_config(), tokens, targets);
        auto step = [&](auto& gpt) {
          test::forward_backward(gpt, tokens, targets, 2, mesh);
          auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::Sgd{.momentum = 0}, mesh);
          const threads::Counters before = mesh.tensor().counters();
          dp.step(0.0, 1.0);
          if (world.rank() != 0) return;
          std::lock_guard lock(mu);
          ran = mesh.tensor().counters() - before;
        };
        if (sp) {
          gpt2::Model<double, true> gpt(h, test::tiny_config(), mesh.spread(), 2);
          step(gpt);
        } else {
          gpt2::Model<double, false> gpt(h, test::tiny_config(), mesh.spread(), 2);
          step(gpt);
        }
      });
      // Besides the plan's rows the step runs the gradient norm's all-reduce (one double).
      const auto ar = static_cast<std::size_t>(threads::Op::all_reduce);
      CHECK_MESSAGE(ran.calls[ar] == planned_calls + 1, "tp ", tp, " SP ", sp);
      CHECK_MESSAGE(ran.bytes[ar] == planned_bytes + 8, "tp ", tp, " SP ", sp);
      CHECK(planned_calls == (sp ? 1u : 0u));
    }
  }
}

TEST_CASE("describe prints every layer with its layouts and collectives") {
  const std::string d =
      describe<gpt2::Model<double, false, recompute::None, Meta<Host>>>(test::tiny_config(), 2, {.tensor_degree = 2});
  CHECK(d.find("h1.mlp.fc (ColumnParallel, GELU)") != std::string::npos);
  CHECK(d.find("all_reduce(tensor) 8192 B") != std::string::npos);  // (2, 16, 32) doubles
  CHECK(d.find("LM head (tied, vocab-parallel: 33 of 65 rows)") != std::string::npos);
  MESSAGE(d);
}
