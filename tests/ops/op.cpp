// An op written outside weft (ops/op.hpp): a user's ReLU-squared, its host
// specialization, and a layer that calls it the way weft's layers call weft's ops, composed with
// weft's Linear layers in a Sequential. Its gradients match finite differences in double, and
// tensor 2 equals one rank within 1e-12; nothing of weft's is edited for it.
#include <doctest/doctest.h>

#include <map>
#include <mutex>

#include "support/gradcheck.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/ops/op.hpp"

// ---- the user's code ------------------------------------------------------------------------
namespace user {

// y = relu(x)^2, dx = 2 relu(x) dy (So et al., 2021, Primer).
template <class D>
struct ReluSquared;

template <>
struct ReluSquared<weft::Host> {
  template <class T>
  static void forward(weft::Host&, T* y, const T* x, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] * x[i] : T(0);
  }
  template <class T>
  static void backward(weft::Host&, T* dx, const T* x, const T* dy, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? T(2) * x[i] * dy[i] : T(0);
  }
};

// The layer: elementwise on feature shards (between a ColumnParallel and a RowParallel Linear).
template <class T, class D = weft::Host>
class ReluSquaredLayer {
 public:
  using In = weft::nn::act::Features;
  using Out = In;
  using GradIn = In;
  using GradOut = In;
  struct Ctx {
    weft::Tensor<T, In, D> x;
  };

  weft::Tensor<T, Out, D> forward(Ctx& ctx, const weft::Tensor<T, In, D>& x) {
    auto y = weft::Tensor<T, Out, D>::empty(x.dev(), x.global_shape(), x.spread(), weft::Category::activations);
    ReluSquared<D>::forward(x.dev(), y.data(), x.data(), x.numel());
    ctx.x = x.clone(weft::Category::activations);
    return y;
  }
  weft::Tensor<T, GradIn, D> backward(Ctx& ctx, const weft::Tensor<T, GradOut, D>& dy) {
    auto dx = weft::Tensor<T, GradIn, D>::empty(dy.dev(), dy.global_shape(), dy.spread(), weft::Category::activations);
    ReluSquared<D>::backward(dy.dev(), dx.data(), ctx.x.data(), dy.data(), dy.numel());
    ctx = Ctx{};
    return dx;
  }
  weft::Shape out_shape(const weft::Shape& s) const { return s; }
  static std::string name() { return "ReluSquared"; }
  template <class F>
  void for_each_param(const std::string&, F&&) {}
};

}  // namespace user
// ---------------------------------------------------------------------------------------------

using namespace weft;
using namespace weft::nn;

namespace {

struct Elsewhere {};  // a device with no specialization
static_assert(ops::ImplementedOn<user::ReluSquared, Host>);
static_assert(!ops::ImplementedOn<user::ReluSquared, Elsewhere>);
static_assert(ops::ImplementedOn<ops::LayerNorm, Host> && ops::ImplementedOn<ops::Gemm, Host>);

using Up = Linear<double, ColumnParallel>;
using Down = Linear<double, RowParallel>;
using Mlp = Sequential<CopyToTensor, Up, user::ReluSquaredLayer<double>, Down, ReduceFromTensor>;

Mlp make(Host& h, const Spread& s) {
  return Mlp(CopyToTensor{}, Up(h, 8, 16, s, 10, 3, 0.5), user::ReluSquaredLayer<double>{},
             Down(h, 16, 8, s, 12, 3, 0.5), ReduceFromTensor{});
}

Tensor<double, act::Full, Host> input(Host& h, const Spread& s) {
  auto x = Tensor<double, act::Full, Host>::empty(h, {2, 3, 8}, s);
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = weft::normal(4, 0, static_cast<std::uint64_t>(i));
  return x;
}

}  // namespace

TEST_CASE("a user's op, called by a user's layer inside weft's Sequential: gradients match finite differences") {
  // 1e-6: the five-point differences' truncation and round-off (support/gradcheck.hpp).
  run_threads(1, [](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    Mlp mlp = make(h, mesh.spread());
    auto x = input(h, mesh.spread());
    const auto R = test::normals(static_cast<std::size_t>(x.numel()), 6);
    auto loss = [&] {
      Mlp::Ctx c;
      auto y = mlp.forward(c, x, mesh);
      return test::dot(std::vector<double>(y.data(), y.data() + y.numel()), R);
    };
    Mlp::Ctx c;
    mlp.forward(c, x, mesh);
    // Both branches of the op are exercised: the saved pre-activations have both signs.
    const auto& pre = std::get<2>(c).x;
    int negative = 0, positive = 0;
    for (std::int64_t i = 0; i < pre.numel(); ++i) (pre.data()[i] < 0 ? negative : positive) += 1;
    REQUIRE(negative > 0);
    REQUIRE(positive > 0);
    auto dy = Tensor<double, act::Full, Host>::empty(h, x.global_shape(), mesh.spread());
    for (std::int64_t i = 0; i < dy.numel(); ++i) dy[i] = R[static_cast<std::size_t>(i)];
    auto dx = mlp.backward(c, dy, mesh);
    const std::vector<double> dxv(dx.data(), dx.data() + dx.numel());
    CHECK(test::gradcheck(std::span<double>(x.data(), static_cast<std::size_t>(x.numel())),
                          std::span<const double>(dxv), loss)
              .worst <= 1e-6);
    std::map<std::string, std::vector<double>> analytic;
    mlp.for_each_param(
        "m", [&](const std::string& n, auto& p) { analytic[n].assign(p.grad.data(), p.grad.data() + p.grad.numel()); });
    REQUIRE(analytic.size() == 4);  // two weights, two biases; the op has none
    mlp.for_each_param("m", [&](const std::string& n, auto& p) {
      CHECK_MESSAGE(test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                                    std::span<const double>(analytic[n]), loss)
                            .worst <= 1e-6,
                    n);
    });
  });
}

TEST_CASE("a user's op under tensor 2 equals one rank within 1e-12") {
  // The op is elementwise on each rank's feature shard; the only difference is the order of the
  // row-parallel partial sums.
  auto run = [](int tp) {
    std::vector<double> out;
    std::mutex mu;
    run_threads(tp, [&](ThreadComm& world) {
      Mesh mesh{world, {.tensor = tp}};
      Host h;
      Mlp mlp = make(h, mesh.spread());
      auto x = input(h, mesh.spread());
      Mlp::Ctx c;
      auto y = mlp.forward(c, x, mesh);
      auto dx = mlp.backward(c, y, mesh);
      std::vector<double> v(y.data(), y.data() + y.numel());
      v.insert(v.end(), dx.data(), dx.data() + dx.numel());
      mlp.for_each_param("m", [&](const std::string&, auto& p) {
        const auto g = redistribute<Replicated>(p.grad, mesh);
        v.insert(v.end(), g.data(), g.data() + g.numel());
      });
      if (world.rank() != 0) return;
      std::lock_guard lock(mu);
      out = v;
    });
    return out;
  };
  const auto one = run(1), two = run(2);
  CHECK(test::rel_error(two, one) <= 1e-12);
}
