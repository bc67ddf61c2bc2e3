// ops::ScaledGemm on the host and the FP8 linear layer (ops/scaled_gemm.hpp, core/float8_gemms.hpp,
// nn/linear.hpp): against fp8::quantize, fp8::quantize_blocks and fp8::scaled_gemm called directly
// (tests/core/float8_scaling.cpp holds those to PyTorch), with the operands laid out and cast as
// core/float8_gemms.hpp's table says; for every transpose, recipe and gradient format. The op sums
// on the host GEMM, in another order than fp8::scaled_gemm: 1e-6 of the largest output. Bad
// recipes and layouts are refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/error.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/nn/comm_walk.hpp"
#include "weft/nn/linear.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/ops/scaled_gemm.hpp"

using namespace weft;

namespace {

std::vector<bf16> randn_bf16(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = bf16(d(gen));
  return v;
}

// op(X) of a row-major X with leading dimension ld, as (rows, cols) floats: X itself, or its transpose.
std::vector<float> op_of(const std::vector<bf16>& x, Trans t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(i * cols + j)] = static_cast<float>(
          t == Trans::no ? x[static_cast<std::size_t>(i * ld + j)] : x[static_cast<std::size_t>(j * ld + i)]);
  return out;
}

template <class M>
std::vector<M> transposed(const std::vector<M>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<M> t(x.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      t[static_cast<std::size_t>(j * rows + i)] = x[static_cast<std::size_t>(i * cols + j)];
  return t;
}

// The reference cast of an operand (rows, K) of a role, written from core/float8_gemms.hpp's table
// with the fixture-tested primitives.
template <class S, class Grad, fp8::Operand role>
auto reference_cast(const std::vector<float>& x, std::int64_t rows, std::int64_t K) {
  using F8 = std::conditional_t<role == fp8::Operand::gradient, Grad, float8_e4m3>;
  if constexpr (std::same_as<S, fp8::scaling::Tensorwise>) return fp8::quantize<fp8::Tensorwise<F8>>(x, rows, K);
  else if constexpr (std::same_as<S, fp8::scaling::Rowwise>) return fp8::quantize<fp8::Rowwise<F8, true>>(x, rows, K);
  else return fp8::quantize_blocks<F8>(x, rows, K, role == fp8::Operand::weight ? S::block : 1, S::block);
}

std::vector<double> widened(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Tensor<bf16, nn::act::Full, Host> tensor_of(Host& dev, const Shape& shape, const std::vector<bf16>& v) {
  auto t = Tensor<bf16, nn::act::Full, Host>::empty(dev, shape, Spread{});
  REQUIRE(static_cast<std::size_t>(t.numel()) == v.size());
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

// f must throw a weft::Error whose message holds every fragment.
template <class F>
void refused(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL("no error thrown");
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& s : fragments) {
      CAPTURE(what);
      CHECK(what.find(s) != std::string::npos);
    }
  }
}

template <class S, class Grad, fp8::Operand ra, fp8::Operand rb>
void check_op(Trans ta, Trans tb) {
  using G = fp8::Gemms<S, Grad>;
  const std::int64_t m = 32, n = 48, k = 64;
  const std::int64_t lda = ta == Trans::no ? k : m, ldb = tb == Trans::no ? n : k;
  const auto a = randn_bf16(static_cast<std::size_t>(m * k), 1, 2.0f);
  const auto b = randn_bf16(static_cast<std::size_t>(n * k), 2, 0.05f);
  std::vector<float> c0(static_cast<std::size_t>(m * n));
  for (std::size_t i = 0; i < c0.size(); ++i) c0[i] = 0.01f * static_cast<float>(i % 7);
  std::vector<float> c = c0;
  Host dev;
  ops::ScaledGemm<Host>::run<G, ra, rb>(dev, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), n,
                                        "a test GEMM");
  // The reference: op(A) (m, k) and op(B)^T (n, k), each cast for its role, their scaled product.
  const auto qa = reference_cast<S, Grad, ra>(op_of(a, ta, m, k, lda), m, k);
  const auto qb = reference_cast<S, Grad, rb>(op_of(b, tb == Trans::no ? Trans::yes : Trans::no, n, k, ldb), n, k);
  const std::vector<float> y = fp8::scaled_gemm(qa, qb);
  std::vector<double> want(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) want[i] = static_cast<double>(y[i]) + 0.5 * c0[i];
  const double err = test::rel_error(widened(c), want);
  CAPTURE(G::name());
  CAPTURE(static_cast<int>(ta));
  CAPTURE(static_cast<int>(tb));
  CHECK(err < 1e-6);  // f32 sums in another order
  // and it is an FP8 product: away from the exact product of the bf16 values, within FP8's error.
  std::vector<double> exact(y.size(), 0.0);
  const auto af = op_of(a, ta, m, k, lda), bf = op_of(b, tb, k, n, ldb);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p)
        s += static_cast<double>(af[static_cast<std::size_t>(i * k + p)]) * bf[static_cast<std::size_t>(p * n + j)];
      exact[static_cast<std::size_t>(i * n + j)] = s + 0.5 * c0[static_cast<std::size_t>(i * n + j)];
    }
  const double gap = test::rel_error(widened(c), exact);
  CHECK(gap > 1e-4);  // e4m3 keeps 3 mantissa bits: the casts move the product
  CHECK(gap < 0.1);
}

template <class S, class Grad>
void check_all_transposes() {
  using fp8::Operand;
  for (const Trans ta : {Trans::no, Trans::yes})
    for (const Trans tb : {Trans::no, Trans::yes}) {
      check_op<S, Grad, Operand::activation, Operand::weight>(ta, tb);
      check_op<S, Grad, Operand::gradient, Operand::weight>(ta, tb);
      check_op<S, Grad, Operand::gradient, Operand::activation>(ta, tb);
    }
}

}  // namespace

TEST_CASE("ops::ScaledGemm on the host equals fp8::scaled_gemm of the operands cast for their roles") {
  using namespace fp8::scaling;
  check_all_transposes<Tensorwise, float8_e5m2>();
  check_all_transposes<Tensorwise, float8_e4m3>();
  check_all_transposes<Rowwise, float8_e5m2>();
  check_all_transposes<Blockwise<16>, float8_e5m2>();
  check_all_transposes<Blockwise<16>, float8_e4m3>();
}

TEST_CASE("an FP8 precision names its GEMMs, and takes bf16 compute") {
  using P = Precision<bf16, float, fp8::Gemms<fp8::scaling::Rowwise>>;
  static_assert(std::same_as<P::compute, bf16> && std::same_as<P::master, float> && P::gemms::fp8);
  CHECK(P::name() == "Precision<bf16, f32, fp8 rowwise, e4m3/e5m2>");
  CHECK(Precision<bf16, float, fp8::Gemms<fp8::scaling::Blockwise<>, float8_e4m3>>::name() ==
        "Precision<bf16, f32, fp8 blockwise 1x128/128x128, e4m3>");
  CHECK(Precision<bf16, float>::name() == "Precision<bf16, f32>");
}

namespace {

template <class S, class Grad>
void check_linear() {
  using G = fp8::Gemms<S, Grad>;
  using L = nn::Linear<bf16, nn::NoParallel, nn::epilogue::None, Host, G>;
  const std::int64_t B = 2, Tn = 16, in = 32, out = 48, N = B * Tn;
  Host dev;
  L lin(dev, in, out, Spread{}, 7, 11);
  const auto xv = randn_bf16(static_cast<std::size_t>(N * in), 3);
  auto x = tensor_of(dev, {B, Tn, in}, xv);
  // A bias that is not 0, so that the test sees it added.
  for (std::int64_t i = 0; i < out; ++i) lin.bias.value.data()[i] = bf16(0.01f * static_cast<float>(i % 5));
  typename L::Ctx ctx;
  const auto y = lin.forward(ctx, x);
  const auto dyv = randn_bf16(static_cast<std::size_t>(N * out), 4, 1e-3f);
  auto dy = tensor_of(dev, {B, Tn, out}, dyv);
  const auto dx = lin.backward(ctx, dy);

  std::vector<bf16> wv(lin.weight.value.data(), lin.weight.value.data() + out * in);
  const auto xf = op_of(xv, Trans::no, N, in, in), wf = op_of(wv, Trans::no, out, in, in);
  const auto dyf = op_of(dyv, Trans::no, N, out, out);
  using fp8::Operand;
  // forward: x (N, in) activation, W (out, in) weight; the GEMM rounded to bf16, then the bias added.
  const auto yf = fp8::scaled_gemm(reference_cast<S, Grad, Operand::activation>(xf, N, in),
                                   reference_cast<S, Grad, Operand::weight>(wf, out, in));
  std::vector<double> y_want(yf.size());
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      const auto at = static_cast<std::size_t>(r * out + o);
      y_want[at] =
          static_cast<float>(bf16(static_cast<float>(bf16(yf[at])) + static_cast<float>(lin.bias.value.data()[o])));
    }
  // dgrad: dy (N, out) gradient, W^T (in, out) weight.
  const auto dxf = fp8::scaled_gemm(reference_cast<S, Grad, Operand::gradient>(dyf, N, out),
                                    reference_cast<S, Grad, Operand::weight>(transposed(wf, out, in), in, out));
  // wgrad: dy^T (out, N) gradient, x^T (in, N) activation, into the f32 gradient.
  const auto dwf = fp8::scaled_gemm(reference_cast<S, Grad, Operand::gradient>(transposed(dyf, N, out), out, N),
                                    reference_cast<S, Grad, Operand::activation>(transposed(xf, N, in), in, N));
  auto got = [](const auto* p, std::size_t n) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(static_cast<float>(p[i]));
    return v;
  };
  CAPTURE(G::name());
  // bf16 outputs: the same f32 value may round to a neighbour after sums in another order (2^-8).
  CHECK(test::rel_error(got(y.data(), y_want.size()), y_want) < 1.0 / 256);
  std::vector<double> dx_want(dxf.size());
  for (std::size_t i = 0; i < dxf.size(); ++i) dx_want[i] = static_cast<float>(bf16(dxf[i]));
  CHECK(test::rel_error(got(dx.data(), dx_want.size()), dx_want) < 1.0 / 256);
  CHECK(test::rel_error(got(lin.weight.grad.data(), dwf.size()), widened(dwf)) < 1e-6);  // f32 sums
}

}  // namespace

TEST_CASE("an FP8 Linear casts x and W for its forward, dy and W for dgrad, dy and x for wgrad") {
  using namespace fp8::scaling;
  check_linear<Tensorwise, float8_e5m2>();
  check_linear<Rowwise, float8_e5m2>();
  check_linear<Rowwise, float8_e4m3>();
  check_linear<Blockwise<16>, float8_e5m2>();
}

TEST_CASE("FP8 refuses what it cannot cast: a sharded layer without its mesh, blocks that do not tile an operand") {
  using G = fp8::Gemms<fp8::scaling::Tensorwise>;
  Host dev;
  Spread two;
  two.tensor_degree = 2;
  nn::Linear<bf16, nn::RowParallel, nn::epilogue::None, Host, G> row(dev, 64, 32, two, 1, 2);
  auto xs = Tensor<bf16, nn::act::Features, Host>::empty(dev, {1, 4, 64}, two);
  std::fill(xs.data(), xs.data() + xs.numel(), bf16(1.0f));
  typename decltype(row)::Ctx row_ctx;
  refused([&] { (void)row.forward(row_ctx, xs); }, {"Linear<RowParallel>'s forward GEMM under fp8 tensorwise",
                                                    "sharded over 2 tensor ranks", "call forward(ctx, x, mesh)"});
  using Blocks = fp8::Gemms<fp8::scaling::Blockwise<128>>;
  nn::Linear<bf16, nn::NoParallel, nn::epilogue::None, Host, Blocks> lin(dev, 32, 64, Spread{}, 1, 2);
  auto x = tensor_of(dev, {1, 4, 32}, std::vector<bf16>(static_cast<std::size_t>(4 * 32), bf16(1.0f)));
  typename decltype(lin)::Ctx ctx;
  refused([&] { (void)lin.forward(ctx, x); },
          {"fp8 blockwise 1x128/128x128, e4m3/e5m2: Linear<NoParallel>'s forward GEMM",
           "(4, 32) does not tile into 1x128", "fp8::scaling::Blockwise<B>"});
}

namespace {

// A Megatron MLP in f32 with FP8 GEMMs: copy, ColumnParallel (GELU), RowParallel, reduce.
template <class G>
using Up = nn::Linear<float, nn::ColumnParallel, nn::epilogue::Gelu, Host, G>;
template <class G>
using Down = nn::Linear<float, nn::RowParallel, nn::epilogue::None, Host, G>;
template <class G>
using FpCol = nn::Named<"up", Up<G>>;
template <class G>
using FpRow = nn::Named<"down", Down<G>>;
template <class G>
using FpMlp = nn::Sequential<nn::CopyToTensor, FpCol<G>, FpRow<G>, nn::ReduceFromTensor>;

struct Sharded {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> grads;
  threads::Counters fwd, bwd;     // the tensor group's
  std::pair<int, int> described;  // describe's collectives, forward and backward
};

// y = mlp(x) and dx, dW for dy = y on `tp` tensor ranks (x, dy replicated); `deferred`: the weight
// gradients in a later pass (zero-bubble schedules' backward_weight).
template <class G>
Sharded run_sharded(int tp, bool deferred = false) {
  Sharded out;
  std::mutex mu;
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host h;
    const Spread s = mesh.spread();
    FpMlp<G> mlp({}, FpCol<G>(Up<G>(h, 32, 64, s, 10, 3, 0.3)), FpRow<G>(Down<G>(h, 64, 32, s, 12, 3, 0.3)), {});
    mlp.defer_weight(deferred);
    auto x = Tensor<float, nn::act::Full, Host>::empty(h, {2, 16, 32}, s);
    for (std::int64_t i = 0; i < x.numel(); ++i)
      x[i] = static_cast<float>(weft::normal(4, 0, static_cast<std::uint64_t>(i)) * (1 + i % 7));
    typename FpMlp<G>::Ctx ctx;
    const auto c0 = mesh.tensor().counters();
    auto y = mlp.forward(ctx, x, mesh);
    const auto c1 = mesh.tensor().counters();
    auto dx = mlp.backward(ctx, y, mesh);
    if (deferred) mlp.backward_weight(ctx);
    const auto c2 = mesh.tensor().counters();
    std::pair<int, int> described{0, 0};
    std::vector<nn::CommRow> rows;  // describe's rows: the same collectives
    nn::layer_comm_rows(rows, "mlp", mlp, x.global_shape(), s, 4);
    for (const auto& row : rows) {
      for (const auto& st : row.forward) CHECK(st.collective == Collective::all_reduce);
      for (const auto& st : row.backward) CHECK(st.collective == Collective::all_reduce);
      described.first += static_cast<int>(row.forward.size());
      described.second += static_cast<int>(row.backward.size());
    }
    std::map<std::string, std::vector<double>> grads;
    mlp.for_each_param("mlp", [&](const std::string& n, auto& p) {
      auto g = redistribute<Replicated>(p.grad, mesh);
      grads[n].assign(g.data(), g.data() + g.numel());
    });
    if (world.rank() != 0) return;
    std::lock_guard lock(mu);
    out = {{y.data(), y.data() + y.numel()}, {dx.data(), dx.data() + dx.numel()}, grads, c1 - c0, c2 - c1, described};
  });
  return out;
}

}  // namespace

TEST_CASE("FP8 on tensor 2 and 4 casts as one rank: the amaxes reduced over the tensor ranks, counted") {
  // With every scale equal to one rank's, the float8 values are the same bytes and only the f32
  // sums' order differs (a RowParallel layer's K in parts, summed by the reduction): 1e-5 relative.
  // A tensorwise scale taken from a shard instead moves casts by up to half an e4m3 step (6%), far
  // past it (tried: y 6% off). Rowwise's power-of-two scales cast alike a power of two apart,
  // except in e4m3's subnormal range, so its reductions are held to the counts and describe's rows.
  using namespace fp8::scaling;
  auto check = [&]<class G>(std::type_identity<G>, int fwd, int bwd) {
    CAPTURE(G::name());
    const Sharded one = run_sharded<G>(1);
    for (int tp : {2, 4})
      for (bool deferred : {false, true}) {
        CAPTURE(tp);
        CAPTURE(deferred);
        const Sharded r = run_sharded<G>(tp, deferred);
        CHECK(test::rel_error(r.y, one.y) < 1e-5);
        CHECK(test::rel_error(r.dx, one.dx) < 1e-5);
        for (const auto& [n, g] : one.grads) CHECK_MESSAGE(test::rel_error(r.grads.at(n), g) < 1e-5, n);
        // The MLP's own pair (ReduceFromTensor forward, CopyToTensor backward) and the casts'.
        CHECK(r.fwd.calls_of(threads::Op::all_reduce) == fwd);
        CHECK(r.bwd.calls_of(threads::Op::all_reduce) == bwd);
        CHECK(r.described == std::pair<int, int>{fwd, bwd});
      }
  };
  // Tensorwise: up's W, down's x and W in forward; up's dy in dgrad (the rest kept from those).
  check(std::type_identity<fp8::Gemms<Tensorwise>>{}, 1 + 3, 1 + 1);
  // Rowwise: down's x and W rows along its sharded K in forward; up's dy and W^T in dgrad.
  check(std::type_identity<fp8::Gemms<Rowwise>>{}, 1 + 2, 1 + 2);
  check(std::type_identity<fp8::Gemms<Rowwise, float8_e4m3>>{}, 1 + 2, 1 + 2);
  // Blockwise: every block within a shard (16 divides each shard's width), nothing to reduce.
  check(std::type_identity<fp8::Gemms<Blockwise<16>>>{}, 1, 1);
}
