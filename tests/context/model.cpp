// Context parallelism through a whole model (llama::Model with Cx = context::Ring or
// context::AllGather): the embedding and head stages on a context rank's rows, the loss over the
// context group, the gradients reduced over data x context ranks. Three AdamW steps on context 2
// and 4, and context 2 beside tensor 2 (with and without sequence parallelism), data 2 (DDP, ZeRO-1)
// or pipe 2 (1F1B), equal one rank.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "support/train_steps.hpp"
#include "weft/models/llama/model.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

// 2 layers (pipe 2 takes one each), 4 heads over 2 key-value heads (tensor 2 holds one group each),
// a sequence of 16 (8 chunks of 2 at context 4), rope scaling on.
const llama::Config kConfig{
    .vocab = 33,
    .seq = 16,
    .layers = 2,
    .heads = 4,
    .kv_heads = 2,
    .width = 16,
    .hidden = 24,
    .rope = {.theta = 500, .factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8},
    .norm_eps = 1e-5,
    .seed = 3,
    .init_std = 0.2};
constexpr std::int64_t kMicro = 4;
constexpr int kM = 2;

template <class Cx, class Strategy = optim::Ddp, bool SP = false>
test::StepsRun run(int pipe, int tensor, int data, int context) {
  return test::train_steps<llama::Model<double, SP, recompute::None, Host, false, Cx>, OneFOneB, Strategy>(
      kConfig, kMicro, kM, pipe, 1, tensor, data, 3, context);
}

void compare(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what, bool grads) {
  // 1e-12: double, the same sums in other orders (the blocks' log-sum-exp merge, the context
  // group's sums of the loss and of the gradients).
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK_MESSAGE(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]), what, " step ", i);
  std::string where;
  if (grads) {
    const double e = test::worst_tensor(got.grads, ref.grads, where);
    CHECK_MESSAGE(e <= 1e-12, what, ": gradient of ", where, " off by ", e);
    MESSAGE(what, ": gradients after step 1 within ", e, " (", where, ")");
  }
  const double v = test::worst_tensor(got.values, ref.values, where);
  CHECK_MESSAGE(v <= 1e-12, what, ": parameters off by ", v, " (", where, ")");
  MESSAGE(what, ": parameters after 3 steps within ", v);
}

template <class Cx>
void check_model(const test::StepsRun& ref) {
  const std::string kind = Cx::name;
  compare(run<Cx>(1, 1, 1, 2), ref, kind + ", context 2", true);
  compare(run<Cx>(1, 1, 1, 4), ref, kind + ", context 4", true);
  compare(run<Cx>(1, 2, 1, 2), ref, kind + ", context 2 x tensor 2", true);
  compare(run<Cx, optim::Ddp, true>(1, 2, 1, 2), ref, kind + ", context 2 x tensor 2 with sequence parallelism", true);
  compare(run<Cx>(1, 1, 2, 2), ref, kind + ", data 2 x context 2, DDP", true);
  compare(run<Cx, optim::Zero1>(1, 1, 2, 2), ref, kind + ", data 2 x context 2, ZeRO-1", false);
  compare(run<Cx>(2, 1, 1, 2), ref, kind + ", pipe 2 (1F1B) x context 2", true);
}

}  // namespace

TEST_CASE(
    "Llama with the sequence over context 2 and 4, alone and beside tensor 2 (SP or not), data 2 or pipe 2, equals one rank "
    "within 1e-12 in double: every loss, gradient and parameter") {
  const auto ref = run<context::None>(1, 1, 1, 1);
  REQUIRE(ref.losses.size() == 3);
  CHECK(ref.losses[2] < ref.losses[0]);  // AdamW at 1e-2 lowers the loss on the Markov corpus
  REQUIRE(ref.grads.count("layers.1.attn.qkv.weight") == 1);
  SUBCASE("ring") { check_model<context::Ring>(ref); }
  SUBCASE("all-gather") { check_model<context::AllGather>(ref); }
}

TEST_CASE(
    "Llama in f32 with the sequence over context 2 beside tensor 2 equals one rank within 1e-5: losses and gradients") {
  // f32 sums in other orders (the blocks' log-sum-exp merge, the context group's sums): 1e-5 of the
  // loss and of each gradient tensor's largest element, as tests/context/attention.cpp bounds the
  // attention alone.
  const auto f32 = [](int tensor, int context, auto cx) {
    using Cx = decltype(cx);
    return test::train_steps<llama::Model<float, false, recompute::None, Host, false, Cx>, OneFOneB>(
        kConfig, kMicro, kM, 1, 1, tensor, 1, 1, context);
  };
  const auto ref = f32(1, 1, context::None{});
  for (const auto& [got, kind] :
       {std::pair{f32(2, 2, context::Ring{}), "ring"}, std::pair{f32(2, 2, context::AllGather{}), "all-gather"}}) {
    REQUIRE(got.losses.size() == 1);
    CHECK(std::abs(got.losses[0] - ref.losses[0]) <= 1e-5 * std::abs(ref.losses[0]));
    std::string where;
    const double e = test::worst_tensor(got.grads, ref.grads, where);
    CHECK_MESSAGE(e <= 1e-5, kind, ": gradient of ", where, " off by ", e);
    MESSAGE(std::string(kind), ", f32, context 2 x tensor 2: loss off by ",
            std::abs(got.losses[0] - ref.losses[0]) / std::abs(ref.losses[0]), " (relative), gradients within ", e,
            " (", where, ")");
  }
}
