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
// With a dense layer (tests/fixtures/qwen3_moe/dense: 3 layers, layer 1 Qwen3MoeMLP of width 24 by
// mlp_only_layers, the others' experts): the same checks on one rank, on expert 2 x tensor 2 with
// SP (the dense MLP tensor-sharded, the experts whole or split over tensor too), and with full
// recompute; the router losses the two sparse layers'; which layers are dense, by transformers'
// rule, and its bad values refused.
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

// The dense fixture's: layer 1 dense, of width 24.
qwen3_moe::Config tiny_dense() {
  qwen3_moe::Config c = tiny();
  c.layers = 3, c.mlp_only_layers = {1}, c.dense_hidden = 24;
  return c;
}

const checkpoint::ImportDir& dense_reference() {
  static const checkpoint::ImportDir r(std::string(WEFT_TEST_DATA_DIR) + "/qwen3_moe/dense", "reference",
                                       "qwen3_moe dense reference");
  return r;
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
  const auto aux = ref.read("aux");
  const test::moe::Run one = run<qwen3_moe::Model<double>>(1, 1, 1);
  const double el = test::moe::check_one_rank(one, ref);
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

TEST_CASE("Qwen3-MoE with a dense layer (mlp_only_layers) equals transformers' in f64") {
  const auto& ref = dense_reference();
  const double loss = ref.read("loss")[0];
  const auto aux = ref.read("aux");
  REQUIRE(aux.size() == 2);  // the sparse layers 0 and 2
  const auto dense = [&]<class Model>(int data, int tensor, int expert) {
    return test::moe::run<Model>(tiny_dense(), ref, data, tensor, expert);
  };
  // Tolerances as above: the same products summed in other orders, about 1e-15 printed.
  const test::moe::Run one = dense.template operator()<qwen3_moe::Model<double>>(1, 1, 1);
  const double el = test::moe::check_one_rank(one, ref);
  MESSAGE("dense layer 1, one rank: logits within ", el, ", cross-entropy ", one.loss, " against ", loss,
          ", gradients within ", one.worst, " (", one.where, ")");
  const test::moe::Run ep = dense.template operator()<qwen3_moe::Model<double, true>>(2, 2, 2);
  CHECK(std::abs(ep.loss - loss) <= 1e-10 * loss);
  CHECK(relative(ep.aux, aux) <= 1e-12);
  CHECK_MESSAGE(ep.worst <= 1e-10, "worst gradient: ", ep.where);
  MESSAGE("dense layer 1, expert 2 x tensor 2 with SP: gradients within ", ep.worst, " (", ep.where, ")");
  // The experts split over tensor too (expert-tensor parallelism), beside the dense layer's MLP.
  const test::moe::Run etp = dense.template operator()<
      qwen3_moe::Model<double, true, recompute::None, Host, nn::AllToAllDispatch, nn::ExpertTensor::sharded>>(2, 2, 2);
  CHECK(std::abs(etp.loss - loss) <= 1e-10 * loss);
  CHECK(relative(etp.aux, aux) <= 1e-12);
  CHECK_MESSAGE(etp.worst <= 1e-10, "worst gradient: ", etp.where);
  MESSAGE("dense layer 1, expert 2 x tensor 2 with SP, the experts split over tensor: gradients within ", etp.worst,
          " (", etp.where, ")");
  const test::moe::Run full = dense.template operator()<qwen3_moe::Model<double, false, recompute::Full>>(1, 2, 1);
  CHECK(std::abs(full.loss - loss) <= 1e-10 * loss);
  CHECK_MESSAGE(full.worst <= 1e-10, "worst gradient: ", full.where);
  MESSAGE("dense layer 1, tensor 2, full recompute: gradients within ", full.worst, " (", full.where, ")");
}

TEST_CASE("Qwen3-MoE's dense layers follow transformers' rule, and bad ones are refused by name") {
  qwen3_moe::Config c = tiny();
  c.layers = 6, c.sparse_step = 2, c.mlp_only_layers = {3};
  // transformers: sparse where l is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
  CHECK(c.dense_layers() == std::vector<std::int64_t>{0, 2, 3, 4});
  c.sparse_step = 1, c.mlp_only_layers = {};
  CHECK(c.dense_layers().empty());
  const auto refused = [](qwen3_moe::Config bad, int tensor, const char* what) {
    CHECK_THROWS_WITH_AS(qwen3_moe::validate(bad, {.tensor_degree = tensor}, false, 4), doctest::Contains(what), Error);
  };
  qwen3_moe::Config bad = tiny();
  bad.sparse_step = 0;
  refused(bad, 1, "a decoder sparse step of 0");
  bad = tiny(), bad.mlp_only_layers = {2};
  refused(bad, 1, "mlp_only_layers names layer 2 of 2");
  bad = tiny_dense(), bad.dense_hidden = 25;
  refused(bad, 2, "dense layers of MLP width 25 (intermediate_size) over a tensor degree of 2");
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
