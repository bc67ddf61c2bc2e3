// Context parallelism through GPT-2 (gpt2::Model with Cx = context::Ring or context::AllGather): the
// learned positions of a context rank's rows, the attention over the context group, the loss over
// it, the gradients reduced over data x context ranks. Three AdamW steps equal one rank's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "support/train_steps.hpp"
#include "weft/models/gpt2/model.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

// 2 layers (pipe 2 takes one each), 4 heads (tensor 2 holds two), a sequence of 16 (8 chunks of 2
// at context 4).
const gpt2::Config kConfig{.vocab = 33, .seq = 16, .layers = 2, .heads = 4, .width = 16, .seed = 5, .init_std = 0.2};
constexpr std::int64_t kMicro = 4;
constexpr int kM = 2;

template <class Cx, class Strategy = optim::Ddp, bool SP = false>
test::StepsRun run(int pipe, int tensor, int data, int context) {
  return test::train_steps<gpt2::Model<double, SP, recompute::None, Host, Cx>, OneFOneB, Strategy>(
      kConfig, kMicro, kM, pipe, 1, tensor, data, 3, context);
}

void compare(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what) {
  // 1e-12: double, the same sums in other orders (the blocks' log-sum-exp merge, the context
  // group's sums of the loss and of the gradients).
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK_MESSAGE(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]), what, " step ", i);
  std::string where;
  const double e = test::worst_tensor(got.grads, ref.grads, where);
  CHECK_MESSAGE(e <= 1e-12, what, ": gradient of ", where, " off by ", e);
  // The parameters as one vector: max |difference| over max |parameter|, the attention's key biases
  // apart. Their exact gradient is zero (the softmax ignores a constant added to a row of scores), so
  // what each run computes is rounding noise |g| of ~1e-16, which Adam turns into updates of
  // lr |g| / (|g| + eps) <= 1e-2 x 1e-16 / 1e-8 = 1e-10 a step: after 3 steps two runs' key biases
  // differ by at most 6e-10 (tests/pipeline/equivalence.cpp meets the same).
  REQUIRE(got.values.size() == ref.values.size());
  const std::int64_t hd = kConfig.width / kConfig.heads;
  double diff = 0, scale = 0, key_bias = 0;
  for (const auto& [name, r] : ref.values)
    for (std::size_t i = 0; i < r.size(); ++i) {
      const double d = std::fabs(got.values.at(name).at(i) - r[i]);
      // (head, {q, k, v}, hd)
      const bool key = name.ends_with("attn.qkv.bias") && (static_cast<std::int64_t>(i) / hd) % 3 == 1;
      (key ? key_bias : diff) = std::max(key ? key_bias : diff, d);
      scale = std::max(scale, std::fabs(r[i]));
    }
  CHECK_MESSAGE(diff / scale <= 1e-12, what, ": parameters off by ", diff / scale);
  CHECK_MESSAGE(key_bias <= 6e-10, what, ": key biases off by ", key_bias);
  MESSAGE(what, ": gradients after step 1 within ", e, ", parameters after 3 steps within ", diff / scale,
          " (key biases ", key_bias, ")");
}

}  // namespace

TEST_CASE(
    "GPT-2 with the sequence over context 2 and 4, alone and beside tensor 2, data 2 or pipe 2, equals one rank "
    "within 1e-12 in double: every loss, gradient and parameter (the learned positions included, SP inside CP)") {
  const auto ref = run<context::None>(1, 1, 1, 1);
  REQUIRE(ref.losses.size() == 3);
  CHECK(ref.losses[2] < ref.losses[0]);
  REQUIRE(ref.grads.count("wpe") == 1);
  compare(run<context::Ring>(1, 1, 1, 2), ref, "ring, context 2");
  compare(run<context::Ring>(1, 2, 1, 2), ref, "ring, context 2 x tensor 2");
  // Sequence parallelism inside context parallelism: each tensor rank adds the learned positions of
  // its slice of the context rank's rows (one chunk each here).
  compare(run<context::AllGather, optim::Ddp, true>(1, 2, 1, 2), ref,
          "all-gather, context 2 x tensor 2 with sequence parallelism");
  compare(run<context::Ring>(2, 1, 1, 2), ref, "ring, pipe 2 (1F1B) x context 2");
  compare(run<context::AllGather>(1, 1, 1, 4), ref, "all-gather, context 4");
  compare(run<context::AllGather>(1, 1, 2, 2), ref, "all-gather, data 2 x context 2, DDP");
}
