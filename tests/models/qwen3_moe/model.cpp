// Qwen3-MoE (models/qwen3_moe/model.hpp) against transformers' Qwen3MoeForCausalLM in float64
// (tools/reference/qwen3_moe_reference.py -> tests/fixtures/qwen3_moe: 2 layers, 4 heads over 2
// key-value heads of head_dim 8 (twice width / heads), QK norm, 4 experts of width 8, the top 2 not
// renormalised; the weights and every gradient under weft's names and layout). The loss a step
// follows: the cross-entropy plus 0.02 times each layer's load-balancing loss and 0.001 times its
// z-loss, from transformers' router logits.
//
// Checked: on one rank the logits, the cross-entropy, each layer's router losses and every
// gradient (the QK norms' among them) within 1e-10 (the same products added in other orders, about
// 1e-16 each); on expert 2 x tensor 2 with SP (data 2: each tensor rank's heads' share of the QK
// norms' gradients summed) and with the all-gather dispatcher on expert 4 (data 4), the loss and
// every gradient the same way; full recompute the same; QK norm with context parallelism refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "support/error.hpp"
#include "support/moe_model.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/qwen3_moe/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace {

qwen3_moe::Config tiny() {
  qwen3_moe::Config c;
  c.vocab = 32, c.seq = 8, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.width = 16, c.hidden = 8;
  c.head_size = 8, c.norm_topk_prob = false;
  c.rope = {.theta = 10000.0}, c.norm_eps = 1e-6, c.seed = 3;
  c.experts = 4, c.top_k = 2, c.aux_coef = 0.02, c.z_coef = 0.001;
  return c;
}

const checkpoint::ImportDir& reference() {
  static const checkpoint::ImportDir r(std::string(WEFT_TEST_DATA_DIR) + "/qwen3_moe", "reference",
                                       "qwen3_moe reference");
  return r;
}

double relative(const std::vector<double>& a, const std::vector<double>& b) { return test::rel_error(a, b); }

template <class Model>
test::moe::Run run(int data, int tensor, int expert) {
  return test::moe::run<Model>(tiny(), reference(), data, tensor, expert);
}

}  // namespace

TEST_CASE("Qwen3-MoE equals transformers' Qwen3MoeForCausalLM in f64: logits, loss, router losses, every gradient") {
  const auto& ref = reference();
  const double loss = ref.read("loss")[0];
  const auto aux = ref.read("aux"), z = ref.read("z");
  const test::moe::Run one = run<qwen3_moe::Model<double>>(1, 1, 1);
  const double el = relative(one.logits, ref.read("logits"));
  CHECK(el <= 1e-10);
  CHECK(std::abs(one.loss - loss) <= 1e-10 * loss);
  CHECK(relative(one.aux, aux) <= 1e-12);
  CHECK(relative(one.z, z) <= 1e-12);
  CHECK_MESSAGE(one.worst <= 1e-10, "worst gradient: ", one.where);
  MESSAGE("one rank: logits within ", el, ", cross-entropy ", one.loss, " against ", loss, ", gradients within ",
          one.worst, " (", one.where, ")");
  const test::moe::Run ep = run<qwen3_moe::Model<double, true>>(2, 2, 2);
  CHECK(std::abs(ep.loss - loss) <= 1e-10 * loss);
  CHECK(relative(ep.aux, aux) <= 1e-12);
  CHECK_MESSAGE(ep.worst <= 1e-10, "worst gradient: ", ep.where);
  MESSAGE("expert 2 x tensor 2 with SP: cross-entropy ", ep.loss, ", gradients within ", ep.worst, " (", ep.where, ")");
  const test::moe::Run ag = run<qwen3_moe::Model<double, false, recompute::None, Host, nn::AllGatherDispatch>>(4, 1, 4);
  CHECK(std::abs(ag.loss - loss) <= 1e-10 * loss);
  CHECK_MESSAGE(ag.worst <= 1e-10, "worst gradient: ", ag.where);
  MESSAGE("expert 4 (data 4), all-gather dispatcher: gradients within ", ag.worst, " (", ag.where, ")");
  const test::moe::Run full = run<qwen3_moe::Model<double, false, recompute::Full>>(1, 2, 1);
  CHECK(std::abs(full.loss - loss) <= 1e-10 * loss);
  CHECK_MESSAGE(full.worst <= 1e-10, "worst gradient: ", full.where);
  MESSAGE("tensor 2, full recompute: gradients within ", full.worst, " (", full.where, ")");
}

TEST_CASE("GroupedQueryAttention refuses QK norm with context parallelism, and odd head sizes, by name") {
  run_threads(1, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {}};
    using Ring = nn::GroupedQueryAttention<double, recompute::None, Host, context::Ring>;
    CHECK_THROWS_WITH_AS(Ring(h, 16, 4, 2, nn::QkNorm{8, 1e-6}, ops::Rope{}, mesh.spread(), 1, 1, 0.1, 0.1),
                         doctest::Contains("QK norm (eps 1e-06) with context parallelism (ring)"), Error);
    qwen3_moe::Config c = tiny();
    c.head_size = 7;
    CHECK_THROWS_WITH_AS(qwen3_moe::Model<double>(h, c, mesh.spread(), 4), doctest::Contains("a head size of 7"),
                         Error);
  });
}
