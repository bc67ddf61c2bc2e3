// nn::Either (nn/either.hpp): a layer that is one of two, chosen when built. Holding either one it
// computes what that layer alone computes, bit for bit (output, input gradient, parameter gradients,
// inside a Residual with its fused add too), on one rank and on tensor 2; names its parameters as the
// held layer; the walks go into the held layer (for_each_layer, describe's rows: the held layer's
// collectives only), and contains_layer answers for both at compile time.
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/nn/comm_walk.hpp"
#include "weft/nn/either.hpp"
#include "weft/nn/layer_walk.hpp"
#include "weft/nn/sequential.hpp"

using namespace weft;
using namespace weft::nn;

// Its own namespace, not an unnamed one: the nn binary compiles as one unit (UNITY), beside
// tests/nn/sequential.cpp's Col, Row, Result and run.
namespace either_test {

// Two branches from Replicate to Replicate: a Megatron MLP (GELU), and one without the nonlinearity
// and of another width, so that they differ in type, parameters and results.
using Col = Linear<double, ColumnParallel, epilogue::Gelu>;
using Row = Linear<double, RowParallel>;
using Plain = Linear<double, ColumnParallel>;
using Mlp = Sequential<CopyToTensor, Named<"up", Col>, Named<"down", Row>, ReduceFromTensor>;
using Thin = Sequential<CopyToTensor, Named<"in", Plain>, Named<"out", Row>, ReduceFromTensor>;
using Choice = Either<Mlp, Thin>;
template <class L> struct is_plain : std::bool_constant<std::same_as<L, Plain>> {};
template <class L> struct is_gelu : std::bool_constant<std::same_as<L, Col>> {};

Mlp make_mlp(Host& h, const Spread& s) {
  return Mlp({}, Named<"up", Col>(Col(h, 8, 12, s, 10, 3, 0.4)), Named<"down", Row>(Row(h, 12, 8, s, 12, 3, 0.4)), {});
}
Thin make_thin(Host& h, const Spread& s) {
  return Thin({}, Named<"in", Plain>(Plain(h, 8, 4, s, 20, 3, 0.4)), Named<"out", Row>(Row(h, 4, 8, s, 22, 3, 0.4)),
              {});
}

struct Result {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> grads;
  bool operator==(const Result&) const = default;
};

// y = layer(x) (inside a Residual where `residual`), dx for dy = y, the parameters' gradients.
template <class L>
Result run(int tp, bool residual, auto make) {
  Result out;
  std::mutex mu;
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host h;
    auto x = Tensor<double, act::Full, Host>::empty(h, {2, 3, 8}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = weft::normal(4, 0, static_cast<std::uint64_t>(i));
    const auto go = [&](auto& layer) {
      typename std::remove_cvref_t<decltype(layer)>::Ctx ctx;
      auto y = layer.forward(ctx, x, mesh);
      auto dx = layer.backward(ctx, y, mesh);
      Result r{{y.data(), y.data() + y.numel()}, {dx.data(), dx.data() + dx.numel()}, {}};
      layer.for_each_param("p", [&](const std::string& n, auto& p) {
        auto g = redistribute<Replicated>(p.grad, mesh);
        r.grads[n].assign(g.data(), g.data() + g.numel());
      });
      return r;
    };
    Result r;
    if (residual) {
      Residual<L> layer(L(make(h, mesh.spread())));
      r = go(layer);
    } else {
      L layer(make(h, mesh.spread()));
      r = go(layer);
    }
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = r;
  });
  return out;
}

int collectives(const std::vector<CommRow>& rows) {
  int n = 0;
  for (const auto& r : rows) n += static_cast<int>(r.forward.size() + r.backward.size());
  return n;
}

TEST_CASE("Either computes what the layer it holds computes, bit for bit, alone and in a Residual") {
  for (int tp : {1, 2})
    for (bool residual : {false, true}) {
      INFO("tensor ", tp, residual ? ", in a Residual" : "");
      const Result mlp = run<Mlp>(tp, residual, make_mlp), thin = run<Thin>(tp, residual, make_thin);
      CHECK(run<Choice>(tp, residual, make_mlp) == mlp);
      CHECK(run<Choice>(tp, residual, make_thin) == thin);
      CHECK(mlp.y != thin.y);  // the two differ, so the comparisons above could fail
      CHECK(mlp.grads.contains("p.up.weight"));
      CHECK(thin.grads.contains("p.in.weight"));
      CHECK(!thin.grads.contains("p.up.weight"));
    }
}

TEST_CASE("Either's walks go into the held layer, and contains_layer answers for both") {
  run_threads(1, [](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    Choice a(make_mlp(h, mesh.spread())), b(make_thin(h, mesh.spread()));
    CHECK(a.holds_first());
    CHECK(!b.holds_first());
    int gelu = 0, plain = 0;
    const auto count = [&](auto& leaf) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      if constexpr (std::same_as<L, Col>) ++gelu;
      if constexpr (std::same_as<L, Plain>) ++plain;
    };
    for_each_layer(a, count);
    CHECK((gelu == 1 && plain == 0));
    for_each_layer(b, count);
    CHECK((gelu == 1 && plain == 1));
    // Describe's rows: the held layer's, under the same name, its collectives (CopyToTensor's and
    // ReduceFromTensor's, one each way) and its output width.
    const Shape in{2, 3, 8};
    std::vector<CommRow> held, alone;
    CHECK(layer_comm_rows(held, "b", b, in, Spread{.tensor_degree = 2}, 8) == Shape{2, 3, 8});
    Thin t = make_thin(h, mesh.spread());
    layer_comm_rows(alone, "b", t, in, Spread{.tensor_degree = 2}, 8);
    REQUIRE(held.size() == alone.size());
    for (std::size_t i = 0; i < held.size(); ++i) CHECK(held[i].layer == alone[i].layer);
    CHECK(collectives(held) == 2);
  });
  // Each alternative's leaves count, whichever a built layer holds.
  static_assert(!contains_layer<Mlp, is_plain>);
  static_assert(contains_layer<Residual<Choice>, is_plain>);
  static_assert(contains_layer<Residual<Choice>, is_gelu>);
}

}  // namespace either_test
