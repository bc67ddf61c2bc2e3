// GPT-2's block and model: the collectives on the tensor axis match Megatron's counts, sequence parallelism
// leaves LayerNorm gradients Partial on the tensor axis until the step reduces them (then identical on
// every tensor rank), and bad configurations are refused before allocation with the values named.
#include <doctest/doctest.h>

#include <mutex>

#include "support/error.hpp"
#include "support/gpt_step.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/optim/data_parallel.hpp"

using namespace weft;
using namespace weft::nn;
using threads::Op;

namespace {

struct Counts {
  threads::Counters fwd, bwd;
};

template <bool SP, class Policy = recompute::None>
Counts block_counts(int tp) {
  Counts out;
  std::mutex mu;
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host h;
    using S = gpt2::Spec<double, SP, Policy>;
    using A = typename S::A;
    auto block = S::make_block(h, {.seq = 8, .layers = 2, .heads = 4, .width = 16, .seed = 3}, mesh.spread(), 0);
    auto x = Tensor<double, A, Host>::empty(h, {2, 8, 16}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i)
      x[i] = weft::normal(1, 0, static_cast<std::uint64_t>(x.global_index(i)));
    typename S::Block::Ctx ctx;
    const auto c0 = mesh.tensor().counters();
    auto y = block.forward(ctx, x, mesh);
    const auto c1 = mesh.tensor().counters();
    block.backward(ctx, y, mesh);
    const auto c2 = mesh.tensor().counters();
    if (world.rank() == 0) {
      std::lock_guard lock(mu);
      out = {c1 - c0, c2 - c1};
    }
  });
  return out;
}

}  // namespace

TEST_CASE("one Block without SP: 2 all-reduces forward and 2 backward on the tensor axis") {
  const Counts c = block_counts<false>(2);
  CHECK(c.fwd.calls_of(Op::all_reduce) == 2);
  CHECK(c.bwd.calls_of(Op::all_reduce) == 2);
  for (Op op : {Op::all_gather, Op::reduce_scatter, Op::all_to_all, Op::broadcast}) {
    CHECK(c.fwd.calls_of(op) == 0);
    CHECK(c.bwd.calls_of(op) == 0);
  }
  // Each all-reduce moves one (B, T, C) activation: 2 x 8 x 16 doubles.
  CHECK(c.fwd.bytes_of(Op::all_reduce) == 2 * 2 * 8 * 16 * 8);
}

TEST_CASE("one Block with SP: an all-gather and a reduce-scatter per branch each way, no LayerNorm all-reduce") {
  const Counts c = block_counts<true>(2);
  CHECK(c.fwd.calls_of(Op::all_gather) == 2);
  CHECK(c.fwd.calls_of(Op::reduce_scatter) == 2);
  CHECK(c.fwd.calls_of(Op::all_reduce) == 0);
  CHECK(c.bwd.calls_of(Op::all_gather) == 2);
  CHECK(c.bwd.calls_of(Op::reduce_scatter) == 2);
  CHECK(c.bwd.calls_of(Op::all_reduce) == 0);  // the LayerNorm gradients stay Partial until the step
  // Full recompute repeats the forward's collectives inside backward.
  const Counts f = block_counts<true, recompute::Full>(2);
  CHECK(f.bwd.calls_of(Op::all_gather) == 4);
  CHECK(f.bwd.calls_of(Op::reduce_scatter) == 4);
}

TEST_CASE(
    "with SP the LayerNorm and position gradients are Partial until the step, then identical on every tensor rank") {
  std::mutex mu;
  std::vector<std::vector<double>> partial, reduced;
  run_threads(4, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = 4}};
    Host h;
    const gpt2::Config c{.vocab = 32, .seq = 8, .layers = 2, .heads = 4, .width = 16};
    gpt2::Model<double, true> gpt(h, c, mesh.spread(), 2);
    std::vector<std::int32_t> tokens(16), targets(16);
    for (std::size_t i = 0; i < 16; ++i) {
      tokens[i] = static_cast<std::int32_t>(i * 3 % 32);
      targets[i] = static_cast<std::int32_t>((i * 5 + 1) % 32);
    }
    test::forward_backward(gpt, tokens, targets, 2, mesh);
    const auto ln_grads = [&] {
      std::vector<double> ln;
      gpt.for_each_param([&](const std::string& name, auto& p) {
        const bool partial_sum = name.find("ln") != std::string::npos || name == "wpe";
        // the type says so
        CHECK(IsPartial<typename std::remove_cvref_t<decltype(p)>::grad_layout::tensor> == partial_sum);
        if (!partial_sum) return;
        ln.insert(ln.end(), p.grad.data(), p.grad.data() + p.grad.numel());
      });
      return ln;
    };
    const std::vector<double> before = ln_grads();
    // A step at learning rate 0 runs the reduction and leaves the parameters as they are.
    auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::Sgd{.momentum = 0}, mesh);
    dp.step(0.0, 0.0);
    const std::vector<double> after = ln_grads();
    std::lock_guard lock(mu);
    partial.push_back(before);
    reduced.push_back(after);
  });
  REQUIRE(reduced.size() == 4);
  CHECK(reduced[0].size() == (2 * 4 + 2) * 16 + 8 * 16);  // 2 blocks x 4 LayerNorm vectors, ln_f, wpe
  for (const auto& s : reduced) CHECK(s == reduced[0]);
  // Before the step each rank held its own sequence slice's addend: they differ, and sum to the result.
  CHECK(partial[0] != partial[1]);
  double worst = 0;
  for (std::size_t i = 0; i < reduced[0].size(); ++i) {
    const double sum = partial[0][i] + partial[1][i] + partial[2][i] + partial[3][i];
    worst = test::worse(worst, std::fabs(sum - reduced[0][i]) / std::max(1e-9, std::fabs(reduced[0][i])));
  }
  CHECK(worst <= 1e-12);  // the reduction adds the four addends in rank order: reassociation only
}

TEST_CASE("bad configurations are refused before allocation with the values and the valid choices") {
  const Spread tp4{.tensor_degree = 4};
  CHECK_THROWS_WITH_AS(
      gpt2::validate(gpt2::Config{.heads = 6, .width = 36}, tp4, false, 2),
      "GPT-2: tensor degree 4 does not divide 6 heads; use a tensor degree that divides the heads, such as "
      "1, 2, 3, 6",
      Error);
  CHECK_THROWS_WITH_AS(
      gpt2::validate(gpt2::Config{.heads = 5, .width = 32}, {}, false, 2),
      "GPT-2: width 32 is not divisible by 5 heads; use a head count that divides the width, such as 1, 2, "
      "4, 8, 16, 32",
      Error);
  CHECK_THROWS_WITH_AS(
      gpt2::validate(gpt2::Config{.seq = 10, .heads = 4}, tp4, true, 2),
      "GPT-2: sequence parallelism needs the tensor degree 4 to divide the sequence length 10; use a "
      "tensor degree that divides the sequence length, such as 1, 2, 5, 10, or a sequence length that it "
      "divides",
      Error);
  CHECK_NOTHROW(gpt2::validate(gpt2::Config{.seq = 10, .heads = 4}, tp4, false, 2));  // fine without SP
  CHECK_THROWS_WITH_AS(gpt2::validate(gpt2::Config{}, {.data_degree = 4}, false, 6),
                       "GPT-2: data degree 4 does not divide the batch of 6; use a batch that is a multiple of 4",
                       Error);
  CHECK_THROWS_WITH_AS(gpt2::validate(gpt2::Config{.layers = 0}, {}, false, 2),
                       doctest::Contains("include one below 1"), Error);
  // Sizes near 2^62 are refused at once (no loop over their divisors), with the nearest few.
  CHECK_THROWS_WITH_AS(gpt2::validate(gpt2::Config{.heads = 3, .width = std::int64_t{1} << 62}, {}, false, 2),
                       doctest::Contains("such as 1, 2, 4, 8, 16, 32, 64, 128"), Error);
  CHECK_THROWS_WITH_AS(gpt2::validate(gpt2::Config{.seq = (std::int64_t{1} << 62) - 1, .heads = 4}, tp4, true, 2),
                       doctest::Contains("such as 1, 3, 1537228672809129301, 4611686018427387903"), Error);
  // The vocabulary need not divide: it is padded, and the padding is masked (see the equivalence tests).
  CHECK(padded_vocab(65, 4) == 68);
  CHECK_NOTHROW(gpt2::validate(gpt2::Config{.vocab = 65}, tp4, false, 2));
  // Through the constructor: the Error comes before any parameter is allocated.
  Host h;
  CHECK_THROWS_AS((gpt2::Model<double>(h, gpt2::Config{.heads = 6, .width = 36}, tp4, 2)), Error);
  CHECK(h.memory().total_peak == 0);
}

TEST_CASE("bad tokens are refused with the position and the vocabulary") {
  run_threads(1, [](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    gpt2::Model<double> gpt(h, gpt2::Config{.vocab = 10, .seq = 4, .layers = 1, .heads = 2, .width = 8}, mesh.spread(),
                            1);
    std::vector<std::int32_t> ok{1, 2, 3, 4}, bad{1, 2, 10, 4};
    CHECK_THROWS_WITH_AS(test::forward_backward(gpt, bad, ok, 1, mesh),
                         "GPT-2::in_flight: token 10 or target 3 at position 2 is outside the vocabulary of 10; "
                         "pass ids in [0, vocab)",
                         Error);
    CHECK_THROWS_WITH_AS(test::forward_backward(gpt, ok, std::vector<std::int32_t>{1, 2}, 1, mesh),
                         "GPT-2::in_flight: the field 'targets' holds 2 values where the local batch needs 4; pass "
                         "(batch / data degree) x seq (4) values",
                         Error);
  });
}
