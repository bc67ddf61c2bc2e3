// Finite-difference gradient checks in double of every layer and of the whole Gpt, on one rank
// (the equivalence tests carry the result to every tensor degree): each parameter and each input,
// 100 random elements or all of them, relative error <= 1e-6 (see support/gradcheck.hpp).
#include <doctest/doctest.h>

#include <map>

#include "support/gpt_step.hpp"
#include "support/gradcheck.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"

using namespace weft;
using namespace weft::nn;
using test::gradcheck;

namespace {

template <class Tn>
std::span<double> all(Tn& t) {
  return {t.data(), static_cast<std::size_t>(t.numel())};
}
template <class Tn>
std::vector<double> copy(const Tn& t) {
  return {t.data(), t.data() + t.numel()};
}

// The worst gradcheck over every parameter of a layer, given loss() and the analytic gradients
// collected right after one backward.
template <class Layer, class Loss>
double check_params(Layer& layer, Loss&& loss, std::map<std::string, double>& report) {
  std::map<std::string, std::vector<double>> analytic;
  layer.for_each_param("p", [&](const std::string& n, auto& p) { analytic[n] = copy(p.grad); });
  double worst = 0;
  layer.for_each_param("p", [&](const std::string& n, auto& p) {
    const auto r = gradcheck(all(p.value), std::span<const double>(analytic[n]), loss);
    report[n] = r.worst;
    worst = test::worse(worst, r.worst);
  });
  return worst;
}

template <class Layout>
Tensor<double, Layout, Host> random_act(Host& h, const Shape& g, std::uint64_t seed) {
  auto t = Tensor<double, Layout, Host>::empty(h, g, {});
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = weft::normal(seed, 3, static_cast<std::uint64_t>(i));
  return t;
}

}  // namespace

TEST_CASE_TEMPLATE("Linear: gradients of parameters and input match finite differences", Role, ColumnParallel,
                   RowParallel, NoParallel) {
  Host h;
  Linear<double, Role, std::conditional_t<std::same_as<Role, ColumnParallel>, epilogue::Gelu, epilogue::None>> lin(
      h, 6, 5, {}, 10, 99, 0.5);
  for (std::int64_t i = 0; i < lin.bias.value.numel(); ++i) lin.bias.value[i] = 0.1 * static_cast<double>(i);
  auto x = random_act<typename decltype(lin)::In>(h, {2, 3, 6}, 1);
  const auto R = test::normals(2 * 3 * 5, 2);
  auto loss = [&] {
    typename decltype(lin)::Ctx ctx;
    auto y = lin.forward(ctx, x);
    return test::dot(copy(y), R);
  };
  typename decltype(lin)::Ctx ctx;
  lin.forward(ctx, x);
  auto dy = Tensor<double, typename decltype(lin)::GradOut, Host>::empty(h, {2, 3, 5}, {});
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
  const auto dx = copy(lin.backward(ctx, dy));
  std::map<std::string, double> report;
  CHECK(check_params(lin, loss, report) <= 1e-6);
  CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
}

TEST_CASE("Linear without a bias has no bias parameter and the same gradients otherwise") {
  Host h;
  Linear<double, RowParallel> lin(h, 6, 5, {}, 10, 99, 0.5, false);
  int params = 0;
  lin.for_each_param("p", [&](const std::string& n, auto&) {
    CHECK(n == "p.weight");
    ++params;
  });
  CHECK(params == 1);
  auto x = random_act<act::Features>(h, {2, 3, 6}, 1);
  const auto R = test::normals(30, 2);
  auto loss = [&] {
    Linear<double, RowParallel>::Ctx ctx;
    return test::dot(copy(lin.forward(ctx, x)), R);
  };
  Linear<double, RowParallel>::Ctx ctx;
  lin.forward(ctx, x);
  auto dy = Tensor<double, act::Full, Host>::empty(h, {2, 3, 5}, {});
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
  const auto dx = copy(lin.backward(ctx, dy));
  std::map<std::string, double> report;
  CHECK(check_params(lin, loss, report) <= 1e-6);
  CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
}

TEST_CASE("LayerNorm attention Mlp and Block: gradients match finite differences") {
  Host h;
  const Shape g{2, 5, 8};
  const auto R = test::normals(static_cast<std::size_t>(g.numel()), 4);
  auto dy_of = [&]<class L>() {
    auto dy = Tensor<double, L, Host>::empty(h, g, {});
    for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
    return dy;
  };
  std::map<std::string, double> report;

  SUBCASE("LayerNorm") {
    LayerNorm<double, act::Full> ln(h, 8, {}, 1, 7);
    for (std::int64_t i = 0; i < 8; ++i) ln.weight.value[i] = 1.0 + 0.1 * static_cast<double>(i);
    auto x = random_act<act::Full>(h, g, 5);
    auto loss = [&] {
      LayerNorm<double, act::Full>::Ctx c;
      return test::dot(copy(ln.forward(c, x)), R);
    };
    LayerNorm<double, act::Full>::Ctx c;
    ln.forward(c, x);
    const auto dx = copy(ln.backward(c, dy_of.operator()<act::Full>()));
    CHECK(check_params(ln, loss, report) <= 1e-6);
    CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
  }
  SUBCASE("GroupedQueryAttention, multi-head with biases and no rotation (GPT-2's)") {
    auto attn = GroupedQueryAttention<double>::multi_head(h, 8, 2, {}, 1, 7, 0.3, 0.3);
    auto x = random_act<act::Full>(h, g, 6);
    auto loss = [&] {
      GroupedQueryAttention<double>::Ctx c;
      return test::dot(copy(attn.forward(c, x)), R);
    };
    GroupedQueryAttention<double>::Ctx c;
    attn.forward(c, x);
    const auto dx = copy(attn.backward(c, dy_of.operator()<act::Full>()));
    CHECK(check_params(attn, loss, report) <= 1e-6);
    CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
  }
  SUBCASE("GroupedQueryAttention, bidirectional, probabilities recomputed in backward (a DiT's, a ViT's)") {
    using Attn = GroupedQueryAttention<double, recompute::Selective, Host, context::None, mask::Bidirectional>;
    auto attn = Attn::multi_head(h, 8, 2, {}, 1, 7, 0.3, 0.3);
    auto x = random_act<act::Full>(h, g, 6);
    auto loss = [&] {
      typename Attn::Ctx c;
      return test::dot(copy(attn.forward(c, x)), R);
    };
    typename Attn::Ctx c;
    attn.forward(c, x);
    const auto dx = copy(attn.backward(c, dy_of.operator()<act::Full>()));
    CHECK(check_params(attn, loss, report) <= 1e-6);
    CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
  }
  SUBCASE("Mlp") {
    Mlp<double> mlp(h, 8, {}, 1, 7, 0.3, 0.3);
    auto x = random_act<act::Full>(h, g, 7);
    auto loss = [&] {
      Mlp<double>::Ctx c;
      return test::dot(copy(mlp.forward(c, x)), R);
    };
    Mlp<double>::Ctx c;
    mlp.forward(c, x);
    const auto dx = copy(mlp.backward(c, dy_of.operator()<act::Full>()));
    CHECK(check_params(mlp, loss, report) <= 1e-6);
    CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
  }
  SUBCASE("Block") {
    run_threads(1, [&](ThreadComm& w) {
      Mesh mesh{w, {}};
      using S = gpt2::Spec<double, false>;
      S::Block block = S::make_block(h, {.layers = 2, .heads = 2, .width = 8, .seed = 7, .init_std = 0.3}, {}, 0);
      auto x = random_act<act::Full>(h, g, 8);
      auto loss = [&] {
        S::Block::Ctx c;
        return test::dot(copy(block.forward(c, x, mesh)), R);
      };
      S::Block::Ctx c;
      block.forward(c, x, mesh);
      const auto dx = copy(block.backward(c, dy_of.operator()<act::Full>(), mesh));
      CHECK(check_params(block, loss, report) <= 1e-6);
      CHECK(gradcheck(all(x), std::span<const double>(dx), loss).worst <= 1e-6);
    });
  }
  for (const auto& [name, err] : report) MESSAGE(name, ": worst relative error ", err);
}

TEST_CASE("Gpt: every parameter gradient matches finite differences") {
  run_threads(1, [](ThreadComm& w) {
    Mesh mesh{w, {}};
    Host h;
    // Weights of scale 0.5 keep the residual stream O(1): with GPT-2's 0.02 the LayerNorms divide by
    // a standard deviation of ~0.02 and a step of 1e-4 is no longer small (third derivatives ~ 1e5).
    const gpt2::Config cfg{.vocab = 23, .seq = 6, .layers = 2, .heads = 2, .width = 8, .seed = 5, .init_std = 0.5};
    gpt2::Model<double> gpt(h, cfg, mesh.spread(), 2);
    std::vector<std::int32_t> tokens(12), targets(12);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % 23);
      targets[i] = static_cast<std::int32_t>((i * 5 + 1) % 23);
    }
    test::forward_backward(gpt, tokens, targets, 2, mesh);
    std::map<std::string, std::vector<double>> analytic;
    gpt.for_each_param([&](const std::string& n, auto& p) { analytic[n] = copy(p.grad); });
    auto loss = [&] { return test::forward_backward(gpt, tokens, targets, 2, mesh); };
    double worst = 0;
    gpt.for_each_param([&](const std::string& n, auto& p) {
      const auto r = gradcheck(all(p.value), std::span<const double>(analytic[n]), loss);
      CHECK_MESSAGE(r.worst <= 1e-6, n, ": ", r.worst);
      worst = test::worse(worst, r.worst);
    });
    MESSAGE("Gpt: worst relative error over every parameter ", worst);
  });
}
