// The decoder of examples/03_custom_model.hpp, a model weft does not ship: its RMSNorm and ReLU
// squared against finite differences in double; one step's loss and every gradient, and 3 AdamW
// steps, at tensor 2 with and without SP, pipe 2 under 1F1B and ZB-H1, and data 2 under each
// strategy, equal to one rank within 1e-12 in double; a checkpoint saved on one mesh resumes on
// another exactly; a GPT-2 refuses its checkpoint by the record.
#include <doctest/doctest.h>

#include <filesystem>
#include <mutex>

#include "03_custom_model.hpp"
#include "checkpoint/support.hpp"
#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/train/flops.hpp"

using namespace weft;
using namespace weft::pipeline;

namespace {

const gpt2::Config kConfig{.vocab = 33, .seq = 8, .layers = 4, .heads = 2, .width = 16, .seed = 3, .init_std = 0.1};
constexpr std::int64_t kMicro = 4;
constexpr int kM = 4;

// A layer's input and parameter gradients against finite differences of <y, R> (1e-6: the
// five-point rule's error, support/gradcheck.hpp).
template <class Layer, class X>
void check_gradients(Layer& layer, X& x, Host& h, const Spread& s) {
  const auto R = test::normals(static_cast<std::size_t>(x.numel()), 6);
  auto loss = [&] {
    typename Layer::Ctx c;
    auto y = layer.forward(c, x);
    return test::dot(std::vector<double>(y.data(), y.data() + y.numel()), R);
  };
  typename Layer::Ctx c;
  layer.forward(c, x);
  auto dy = X::empty(h, x.global_shape(), s);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
  auto dx = layer.backward(c, dy);
  const std::vector<double> dxv(dx.data(), dx.data() + dx.numel());
  CHECK(test::gradcheck(std::span<double>(x.data(), static_cast<std::size_t>(x.numel())), std::span<const double>(dxv),
                        loss)
            .worst <= 1e-6);
  layer.for_each_param("p", [&](const std::string& n, auto& p) {
    const std::vector<double> g(p.grad.data(), p.grad.data() + p.grad.numel());
    CHECK_MESSAGE(test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                                  std::span<const double>(g), loss)
                          .worst <= 1e-6,
                  n);
  });
}

}  // namespace

TEST_CASE("the custom model's layers match finite differences in double") {
  Host h;
  const Spread s{};
  auto x = Tensor<double, nn::act::Full, Host>::empty(h, {2, 3, 8}, s);
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = weft::normal(4, 0, static_cast<std::uint64_t>(i));
  custom::RmsNormLayer<double, nn::act::Full> norm(h, 8, s, 5, 9);
  for (std::int64_t i = 0; i < 8; ++i)
    norm.weight.value[i] = 1 + 0.1 * weft::normal(5, 1, static_cast<std::uint64_t>(i));
  check_gradients(norm, x, h, s);
  auto f = Tensor<double, nn::act::Features, Host>::empty(h, {2, 3, 8}, s);
  for (std::int64_t i = 0; i < f.numel(); ++i) f[i] = weft::normal(7, 0, static_cast<std::uint64_t>(i));
  nn::Elementwise<custom::ReluSquared, double, nn::act::Features> relu2;
  check_gradients(relu2, f, h, s);
}

TEST_CASE(
    "the custom model at tensor 2 (with and without SP), pipe 2 (1F1B, ZB-H1) and data 2 (every strategy) equals "
    "one rank within 1e-12 in double") {
  // 1e-12: the same sums in another order; double leaves about 1e-15 per operation.
  auto run = [&]<bool SP, class Sched, class Strategy>(int pipe, int tensor, int data) {
    return test::train_steps<custom::Model<double, SP>, Sched, Strategy>(kConfig, kMicro, kM, pipe, 1, tensor, data, 3);
  };
  const auto ref = run.template operator()<false, OneFOneB, optim::Ddp>(1, 1, 1);
  REQUIRE(ref.grads.count("layers.0.up.weight") == 1);
  REQUIRE(ref.grads.count("layers.3.norm2.weight") == 1);
  REQUIRE(ref.grads.count("lm_head") == 1);
  auto compare = [&](const test::StepsRun& got, const std::string& what, bool grads) {
    for (std::size_t i = 0; i < ref.losses.size(); ++i)
      CHECK_MESSAGE(std::abs(got.losses.at(i) - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]), what, " step ", i);
    std::string where;
    if (grads) {
      const double e = test::worst_tensor(got.grads, ref.grads, where);
      CHECK_MESSAGE(e <= 1e-12, what, ": gradient of ", where, " off by ", e);
    }
    double diff = 0, scale = 0;  // the whole parameter vector after 3 steps (tests/pipeline/equivalence.cpp)
    for (const auto& [name, v] : ref.values)
      for (std::size_t i = 0; i < v.size(); ++i) {
        diff = test::worse(diff, std::fabs(got.values.at(name).at(i) - v[i]));
        scale = std::max(scale, std::fabs(v[i]));
      }
    CHECK_MESSAGE(diff / scale <= 1e-12, what, ": parameters off by ", diff / scale);
    MESSAGE(what, ": parameters after 3 steps within ", diff / scale);
  };
  compare(run.template operator()<false, OneFOneB, optim::Ddp>(1, 2, 1), "tensor 2", true);
  compare(run.template operator()<true, OneFOneB, optim::Ddp>(1, 2, 1), "tensor 2, SP", true);
  compare(run.template operator()<false, OneFOneB, optim::Ddp>(2, 1, 1), "pipe 2, 1F1B", true);
  compare(run.template operator()<false, ZeroBubbleH1, optim::Ddp>(2, 1, 1), "pipe 2, ZB-H1", true);
  compare(run.template operator()<false, OneFOneB, optim::Ddp>(1, 1, 2), "data 2, DDP", true);
  compare(run.template operator()<false, OneFOneB, optim::Zero1>(1, 1, 2), "data 2, ZeRO-1", false);
  compare(run.template operator()<false, OneFOneB, optim::Zero2>(1, 1, 2), "data 2, ZeRO-2", false);
  compare(run.template operator()<false, OneFOneB, optim::Fsdp>(1, 1, 2), "data 2, FSDP", false);
}

namespace {
template <class P, bool SP>
using Custom = custom::Model<P, SP, Host>;
}  // namespace

TEST_CASE("the custom model's checkpoint saved on data 2 x tensor 2 (SP, ZeRO-1) resumes on pipe 2 (DDP) exactly") {
  using test::ckpt_run;
  using test::RunPlan;
  const auto dir = test::scratch("custom");
  // The checkpoint tests' run (tests/checkpoint/support.hpp) with the custom model in double.
  const auto whole =
      ckpt_run<double, optim::Ddp, false, checkpoint::Sharded, Custom>({}, RunPlan::fresh("", 6), kConfig, kMicro);
  const auto first = ckpt_run<double, optim::Zero1, true, checkpoint::Sharded, Custom>(
      {.data = 2, .tensor = 2}, RunPlan::fresh(dir, 3), kConfig, kMicro);
  const auto step = dir + "/step_00000003";
  REQUIRE(std::filesystem::exists(step + "/manifest.json"));
  const auto rest = ckpt_run<double, optim::Ddp, false, checkpoint::Sharded, Custom>(
      {.pipe = 2}, RunPlan::resumed(step, "", 6), kConfig, kMicro);
  REQUIRE(first.size() == 3);
  REQUIRE(rest.size() == 3);
  // 1e-12: the same steps on other meshes (other sums' orders); the resume itself is exact (the
  // weights, moments and data position as saved).
  for (std::size_t i = 0; i < 6; ++i) {
    const double got = i < 3 ? first[i] : rest[i - 3];
    CHECK_MESSAGE(std::abs(got - whole[i]) <= 1e-12 * whole[i], "step ", i + 1, ": ", got, " against ", whole[i]);
  }
  // GPT-2 of the same sizes refuses it, naming the field its record lacks.
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    gpt2::Model<double> gpt(h, kConfig, mesh.spread(), kMicro);
    auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
    CHECK_THROWS_WITH_AS(checkpoint::load(step, gpt, dp, mesh), doctest::Contains("relu2_mlp"), Error);
  });
  std::filesystem::remove_all(dir);
}

TEST_CASE("the custom model's FLOPs per token from its declared parameters: an untied head counted, norms not") {
  // 6 (wte V C + wpe T C + lm_head V C + 12 C^2 a block) + 12 L C T; RMSNorm weights are vectors.
  const double C = 16, V = 33, T = 8, L = 4;
  const double want = 6 * (V * C + T * C + V * C + 12 * L * C * C) + 12 * L * C * T;
  for (const int pipe : {1, 2})
    run_threads(pipe, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, {.pipe = pipe}};
      const auto part = Partition::even(pipe, 1, kConfig.layers);
      custom::Model<double> model(h, kConfig, mesh.spread(), kMicro, part.placement(mesh.coord().pipe));
      CHECK(train::declared_flops_per_token(model, mesh) == want);
    });
}
