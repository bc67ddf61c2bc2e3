// Composition as types: Sequential inserts the redistribution a layer boundary needs (or none), and
// the composite equals the replicated computation at every tensor degree.
#include <doctest/doctest.h>

#include <mutex>

#include "support/gradcheck.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/nn/sequential.hpp"

using namespace weft;
using namespace weft::nn;
using threads::Op;

namespace {

// x -> [copy] -> ColumnParallel(GELU) -> RowParallel -> (inserted all-reduce pair) -> ColumnParallel
//   -> RowParallel -> [reduce]: two Megatron MLP-like branches; in and out Replicate.
using Col = Linear<double, ColumnParallel, epilogue::Gelu>;
using Row = Linear<double, RowParallel>;
using Net = Sequential<CopyToTensor, Col, Row, Linear<double, ColumnParallel>, Row, ReduceFromTensor>;

Net make(Host& h, const Spread& s) {
  return Net(CopyToTensor{}, Col(h, 8, 12, s, 10, 3, 0.4), Row(h, 12, 8, s, 12, 3, 0.4),
             Linear<double, ColumnParallel>(h, 8, 16, s, 14, 3, 0.4), Row(h, 16, 8, s, 16, 3, 0.4), ReduceFromTensor{});
}

struct Result {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> grads;
  threads::Counters fwd, bwd;
};

Result run(int tp) {
  Result out;
  std::mutex mu;
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host h;
    Net net = make(h, mesh.spread());
    auto x = Tensor<double, act::Full, Host>::empty(h, {2, 3, 8}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = weft::normal(4, 0, static_cast<std::uint64_t>(i));
    Net::Ctx ctx;
    const auto c0 = mesh.tensor().counters();
    auto y = net.forward(ctx, x, mesh);
    const auto c1 = mesh.tensor().counters();
    auto dx = net.backward(ctx, y, mesh);  // dy = y: the gradient of |y|^2 / 2
    const auto c2 = mesh.tensor().counters();
    std::map<std::string, std::vector<double>> grads;
    net.for_each_param("net", [&](const std::string& n, auto& p) {
      auto g = redistribute<Replicated>(p.grad, mesh);
      grads[n].assign(g.data(), g.data() + g.numel());
    });
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = {{y.data(), y.data() + y.numel()}, {dx.data(), dx.data() + dx.numel()}, grads, c1 - c0, c2 - c1};
  });
  return out;
}

}  // namespace

TEST_CASE("Sequential inserts Megatron's all-reduce pair only where a partial sum meets a replicated input") {
  const Result r = run(2);
  // Forward: one all-reduce between the two Column/Row pairs, one from the explicit ReduceFromTensor.
  CHECK(r.fwd.calls_of(Op::all_reduce) == 2);
  // Backward: the inserted pair's backward (Partial -> Replicate) and CopyToTensor's.
  CHECK(r.bwd.calls_of(Op::all_reduce) == 2);
  CHECK(r.fwd.calls_of(Op::all_gather) + r.fwd.calls_of(Op::reduce_scatter) == 0);
}

TEST_CASE("Sequential under tensor degrees 2 and 4 equals one rank within 1e-12") {
  const Result ref = run(1);
  for (int tp : {2, 4}) {
    const Result r = run(tp);
    CHECK(test::rel_error(r.y, ref.y) <= 1e-12);
    CHECK(test::rel_error(r.dx, ref.dx) <= 1e-12);
    for (const auto& [n, g] : ref.grads) CHECK_MESSAGE(test::rel_error(r.grads.at(n), g) <= 1e-12, n);
  }
}

TEST_CASE("Residual adds the input and its gradient and the composite matches finite differences") {
  run_threads(1, [](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    Residual<Net> res(make(h, mesh.spread()));
    auto x = Tensor<double, act::Full, Host>::empty(h, {2, 3, 8}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = weft::normal(5, 0, static_cast<std::uint64_t>(i));
    const auto R = test::normals(static_cast<std::size_t>(x.numel()), 6);
    auto loss = [&] {
      Residual<Net>::Ctx c;
      auto y = res.forward(c, x, mesh);
      return test::dot(std::vector<double>(y.data(), y.data() + y.numel()), R);
    };
    Residual<Net>::Ctx c;
    res.forward(c, x, mesh);
    auto dy = Tensor<double, act::Full, Host>::empty(h, x.global_shape(), mesh.spread());
    for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
    auto dx = res.backward(c, dy, mesh);
    const std::vector<double> dxv(dx.data(), dx.data() + dx.numel());
    CHECK(test::gradcheck(std::span<double>(x.data(), static_cast<std::size_t>(x.numel())),
                          std::span<const double>(dxv), loss)
              .worst <= 1e-6);
    std::map<std::string, std::vector<double>> analytic;
    res.for_each_param(
        "r", [&](const std::string& n, auto& p) { analytic[n].assign(p.grad.data(), p.grad.data() + p.grad.numel()); });
    res.for_each_param("r", [&](const std::string& n, auto& p) {
      CHECK_MESSAGE(test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                                    std::span<const double>(analytic[n]), loss)
                            .worst <= 1e-6,
                    n);
    });
  });
}

TEST_CASE("Sequential names parameters by position, or by the name Named gives a layer") {
  run_threads(1, [](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    const Spread s = mesh.spread();
    Sequential<Named<"up", Col>, Named<"down", Row>> named(Named<"up", Col>(Col(h, 8, 12, s, 10, 3)),
                                                           Named<"down", Row>(Row(h, 12, 8, s, 12, 3)));
    Sequential<Col, Row> plain(Col(h, 8, 12, s, 10, 3), Row(h, 12, 8, s, 12, 3));
    std::vector<std::string> a, b;
    named.for_each_param("p", [&](const std::string& n, auto&) { a.push_back(n); });
    plain.for_each_param("p", [&](const std::string& n, auto&) { b.push_back(n); });
    CHECK(a == std::vector<std::string>{"p.up.weight", "p.up.bias", "p.down.weight", "p.down.bias"});
    CHECK(b == std::vector<std::string>{"p.0.weight", "p.0.bias", "p.1.weight", "p.1.bias"});
  });
}

namespace {

// A layer whose forward throws: a weft::Error, or another rank's failure (a type derived from it).
template <bool Elsewhere>
struct Throws {
  using In = act::Full;
  using Out = act::Full;
  using GradIn = act::Full;
  using GradOut = act::Full;
  struct Ctx {};
  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Throws"; }
  template <class F>
  void for_each_param(const std::string&, F&&) {}
  Tensor<double, act::Full, Host> forward(Ctx&, const Tensor<double, act::Full, Host>&) {
    if constexpr (Elsewhere) throw threads::FailedElsewhere("ThreadComm", "rank 1 failed", "fix rank 1");
    else throw Error("Throws::forward", "a value of 3", "use 2");
  }
  Tensor<double, act::Full, Host> backward(Ctx&, const Tensor<double, act::Full, Host>& dy) {
    return dy.clone(Category::activations);
  }
};

}  // namespace

TEST_CASE("an error inside a Named layer names its path, and another rank's failure passes unchanged") {
  run_threads(1, [](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    auto x = Tensor<double, act::Full, Host>::empty(h, {1, 2, 4}, mesh.spread());
    using Inner = Sequential<Named<"bad", Throws<false>>>;
    Sequential<Named<"outer", Inner>> net{Named<"outer", Inner>(Inner{Named<"bad", Throws<false>>{}})};
    decltype(net)::Ctx ctx;
    try {
      (void)net.forward(ctx, x, mesh);
      FAIL("no error thrown");
    } catch (const Error& e) {
      CHECK(std::string(e.what()) == "outer.bad: Throws::forward: a value of 3; use 2");
      CHECK(e.path() == "outer.bad");
    }
    using Other = Sequential<Named<"bad", Throws<true>>>;
    Sequential<Named<"outer", Other>> elsewhere{Named<"outer", Other>(Other{Named<"bad", Throws<true>>{}})};
    decltype(elsewhere)::Ctx ctx2;
    CHECK_THROWS_AS((void)elsewhere.forward(ctx2, x, mesh), threads::FailedElsewhere);
  });
}
