// Mixtral (models/mixtral/model.hpp) against transformers' MixtralForCausalLM in float64
// (tools/reference/mixtral_reference.py -> tests/fixtures/mixtral: 2 layers, 4 heads over 2
// key-value heads, 4 experts of width 8, the top 2 renormalised; the weights and every gradient
// under weft's names and layout). The loss a step follows: the cross-entropy plus 0.02 times each
// layer's load-balancing loss and 0.001 times its z-loss, from transformers' router logits.
//
// Checked: on one rank the logits, the cross-entropy, each layer's router losses and every
// gradient within 1e-10 (the same products added in other orders, about 1e-16 each); on expert 2 x
// tensor 2 with SP (data 2) and with the all-gather dispatcher on expert 4 (data 4), the loss and
// every gradient the same way; with each expert split over tensor 2 too (expert-tensor
// parallelism) with SP, and without SP under full recompute with the all-gather dispatcher; bad
// router options refused by name; FP8 (attention and experts) trained 200 steps beside bf16.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "support/error.hpp"
#include "support/moe_model.hpp"
#include "support/train_steps.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/models/mixtral/model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace {

mixtral::Config tiny() {
  mixtral::Config c;
  c.vocab = 32, c.seq = 8, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.width = 16, c.hidden = 8;
  c.rope = {.theta = 10000.0}, c.norm_eps = 1e-5, c.seed = 3;
  c.experts = 4, c.top_k = 2, c.aux_coef = 0.02, c.z_coef = 0.001;
  return c;
}

const checkpoint::ImportDir& reference() {
  static const checkpoint::ImportDir r(std::string(WEFT_TEST_DATA_DIR) + "/mixtral", "reference", "mixtral reference");
  return r;
}

double relative(const std::vector<double>& a, const std::vector<double>& b) { return test::rel_error(a, b); }

template <class Model>
test::moe::Run run(int data, int tensor, int expert) {
  return test::moe::run<Model>(tiny(), reference(), data, tensor, expert);
}

}  // namespace

TEST_CASE("Mixtral equals transformers' MixtralForCausalLM in f64: logits, loss, router losses, every gradient") {
  const auto& ref = reference();
  const double loss = ref.read("loss")[0];
  const auto aux = ref.read("aux");
  const test::moe::Run one = run<mixtral::Model<double>>(1, 1, 1);
  const double el = test::moe::check_one_rank(one, ref);
  MESSAGE("one rank: logits within ", el, ", cross-entropy ", one.loss, " against ", loss, ", gradients within ",
          one.worst, " (", one.where, "); transformers' pooled aux loss ", ref.read("hf_aux")[0], ", weft's per layer ",
          one.aux[0], " and ", one.aux[1]);
  // Expert parallelism with tensor parallelism and SP: each data rank's half of the batch, the
  // experts over expert 2, every gradient gathered from its shards.
  const test::moe::Run ep = run<mixtral::Model<double, true>>(2, 2, 2);
  CHECK(std::abs(ep.loss - loss) <= 1e-10 * loss);
  CHECK(relative(ep.aux, aux) <= 1e-12);
  CHECK_MESSAGE(ep.worst <= 1e-10, "worst gradient: ", ep.where);
  MESSAGE("expert 2 x tensor 2 with SP: cross-entropy ", ep.loss, ", gradients within ", ep.worst, " (", ep.where, ")");
  const test::moe::Run ag = run<mixtral::Model<double, false, recompute::None, Host, nn::AllGatherDispatch>>(4, 1, 4);
  CHECK(std::abs(ag.loss - loss) <= 1e-10 * loss);
  CHECK_MESSAGE(ag.worst <= 1e-10, "worst gradient: ", ag.where);
  MESSAGE("expert 4 (data 4), all-gather dispatcher: gradients within ", ag.worst, " (", ag.where, ")");
  // Expert-tensor parallelism: each expert's hidden features split over tensor 2 as well, with SP
  // (the branch's rows gathered before the experts), and without it under full recompute with the
  // all-gather dispatcher.
  using nn::ExpertTensor::sharded;
  const test::moe::Run etp =
      run<mixtral::Model<double, true, recompute::None, Host, nn::AllToAllDispatch, context::None, sharded>>(2, 2, 2);
  CHECK(std::abs(etp.loss - loss) <= 1e-10 * loss);
  CHECK(relative(etp.aux, aux) <= 1e-12);
  CHECK_MESSAGE(etp.worst <= 1e-10, "worst gradient: ", etp.where);
  MESSAGE("expert 2 x tensor 2 with SP, the experts split over tensor: gradients within ", etp.worst, " (", etp.where,
          ")");
  const test::moe::Run etp_ag =
      run<mixtral::Model<double, false, recompute::Full, Host, nn::AllGatherDispatch, context::None, sharded>>(2, 2, 2);
  CHECK(std::abs(etp_ag.loss - loss) <= 1e-10 * loss);
  CHECK(relative(etp_ag.aux, aux) <= 1e-12);
  CHECK_MESSAGE(etp_ag.worst <= 1e-10, "worst gradient: ", etp_ag.where);
  MESSAGE(
      "expert 2 x tensor 2, the experts split over tensor, all-gather dispatcher, full recompute: gradients within ",
      etp_ag.worst, " (", etp_ag.where, ")");
}

TEST_CASE("Mixtral refuses router options it cannot run, naming them") {
  run_threads(1, [&](ThreadComm& world) {
    Host h;
    Mesh mesh{world, {}};
    mixtral::Config c = tiny();
    c.top_k = 5;
    CHECK_THROWS_WITH_AS(mixtral::Model<double>(h, c, mesh.spread(), 4),
                         "Mixtral: 4 experts, top 5, over an expert degree of 1; use a top-k from 1 to the experts, "
                         "and an expert degree that divides the experts",
                         Error);
    c = tiny();
    Spread s = mesh.spread();
    s.expert_degree = 3;
    CHECK_THROWS_WITH_AS(mixtral::Model<double>(h, c, s, 4),
                         "Mixtral: 4 experts, top 2, over an expert degree of 3; use a top-k from 1 to the experts, "
                         "and an expert degree that divides the experts",
                         Error);
  });
}

TEST_CASE("Mixtral with FP8 GEMMs in its attention and experts trains as bf16 does: 200 host steps within 0.05 nats") {
  // Precision<bf16, float, fp8::Gemms<Rowwise>>: the attention's linear layers and every expert's
  // GEMMs on float8 casts (nn/moe.hpp: each expert's block cast with its own scales; the router in
  // bf16), against bf16 mixed precision from the same weights and batches on data 2 x expert 2 (the
  // experts' blocks gather both data ranks' tokens). The mean of the last 20 losses; 0.05 nats as
  // for Llama's (tests/models/llama/model.cpp).
  mixtral::Config c = tiny();
  c.vocab = 64, c.seq = 32, c.width = 32, c.hidden = 32;
  auto losses = [&]<class P>(std::type_identity<P>) {
    return test::train_steps<mixtral::Model<P>, pipeline::OneFOneB, optim::Ddp>(c, 4, 1, 1, 1, 1, 2, 200, 1, 2).losses;
  };
  const auto b16 = losses(std::type_identity<Precision<bf16, float>>{});
  const auto f8 = losses(std::type_identity<Precision<bf16, float, fp8::Gemms<fp8::scaling::Rowwise>>>{});
  REQUIRE(b16.size() == 200);
  REQUIRE(f8.size() == 200);
  const auto last20 = [](const std::vector<double>& l) {
    double s = 0;
    for (std::size_t i = l.size() - 20; i < l.size(); ++i) s += l[i];
    return s / 20;
  };
  MESSAGE("Mixtral, data 2 x expert 2: last 20 steps FP8 rowwise ", last20(f8), ", bf16 ", last20(b16), " (first ",
          f8[0], ")");
  CHECK(last20(f8) < f8[0] - 1.0);  // it learned
  CHECK(std::abs(last20(f8) - last20(b16)) <= 0.05);
}
