// Side inputs (nn/side.hpp): a model whose first stage makes a per-sample conditioning vector c
// from a field of its batch beside the stream, and whose blocks read c through nn::Modulation and
// nn::Gate (norms without parameters, nn::Normalize, then a per-sample shift and scale before the
// attention and the MLP, a per-sample gate on each branch: DiT's adaLN-Zero), written on
// weft's public headers. c reaches every block on every layout (across pipe ranks too) and its
// gradient returns to the layer that made it.
//
// Checked: every gradient against finite differences on one rank (the conditioning projection's
// among them: its gradient comes only through c), and every layout against one rank in f64
// (1e-12): tensor 2 with and without sequence parallelism, DDP over data 2, 1F1B, interleaved and
// ZB-H1 pipelines over 2 ranks, context 2 (ring and all-gather), data 2 x pipe 2 x context 2 x
// tensor 2 with SP. A Modulation in a model without a side input is a compile error
// (tests/nn/compile_fail/cases.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/nn/feature_stages.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/mlp.hpp"
#include "weft/nn/modulation.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace {

struct Config {
  std::int64_t seq = 8, layers = 4, width = 16, heads = 2, in = 6, out = 3, cond = 5, side = 8;
  std::uint64_t seed = 11;
  double init_std = 0.3;
};

// The batch: features in, target values out, and a conditioning vector per sample.
struct Conditioned {
  std::span<const double> x, y, cond;  // (B/dp, T, in), (B/dp, T, out), (B/dp, cond)
  template <class F>
  void for_each_field(F&& f) {
    f("x", x);
    f("y", y);
    f("cond", cond);
  }
  void check(const Config& c, std::int64_t b, const std::string& where) const {
    nn::check_field(x, b * c.seq * c.in, "x", where, "seq x in");
    nn::check_field(y, b * c.seq * c.out, "y", where, "seq x out");
    nn::check_field(cond, b * c.cond, "cond", where, "cond");
  }
};

// The first stage: the features' projection onto the stream, and c = cond Wc^T + bc beside it.
template <bool SP, class Cx>
struct CondEmbedding {
  using Features = nn::FeatureEmbeddingStage<double, SP, &Conditioned::x, Host, Cx>;
  using A = typename Features::A;
  struct Ctx {
    typename Features::Ctx features;
    std::span<const double> cond;  // (B/dp, cond), the batch's (alive while the micro-batch is)
  };
  Features features;
  nn::Param<double, Replicated, Replicated, Host> weight, bias;  // (side, cond), (side)

  CondEmbedding() = default;
  CondEmbedding(Host& dev, const Config& c, const Spread& s)
      : features(dev, c.in, c.width, s, c.seed, c.init_std),
        weight(dev, {c.side, c.cond}, s, 2, {nn::Init::normal, c.init_std}, c.seed, nn::Decay::yes),
        bias(dev, {c.side}, s, 3, {nn::Init::normal, c.init_std}, c.seed, nn::Decay::no) {}

  template <class Batch, AxisComms M>
  Tensor<double, A, Host> forward(Ctx& ctx, const Batch& in, Tensor<double, nn::act::Full, Host>& side, M& mesh) {
    const std::int64_t B = side.local_shape()[0], K = side.local_shape()[1], Kc = weight.value.global_shape()[1];
    ctx.cond = in.cond;
    Host& h = side.dev();
    ops::Gemm<Host>::run(h, Trans::no, Trans::yes, B, K, Kc, 1.0, in.cond.data(), Kc, weight.value.data(), Kc, 0.0,
                         side.data(), K);
    ops::Bias<Host>::add(h, side.data(), bias.value.data(), B, K);
    return features.forward(ctx.features, in, mesh);
  }
  template <AxisComms M>
  void backward(Ctx& ctx, const Tensor<double, A, Host>& dx, const Tensor<double, nn::act::Full, Host>& dside,
                M& mesh) {
    features.backward(ctx.features, dx, mesh);
    const std::int64_t B = dside.local_shape()[0], K = dside.local_shape()[1], Kc = weight.value.global_shape()[1];
    ops::Gemm<Host>::run(dside.dev(), Trans::yes, Trans::no, K, Kc, B, 1.0, dside.data(), K, ctx.cond.data(), Kc, 1.0,
                         weight.grad.data(), Kc);
    ops::Bias<Host>::backward(dside.dev(), bias.grad.data(), dside.data(), B, K);
    ctx = Ctx{};
  }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    features.for_each_param(prefix, f);
    f(prefix + "cond_proj.weight", weight);
    f(prefix + "cond_proj.bias", bias);
  }
};

template <bool SP, class Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;
  using precision = precision_t<F64>;
  using T = double;
  using config = Config;
  using device = Host;
  using Inputs = Conditioned;
  using Local = nn::stream<SP>;
  using A = typename nn::stream<SP, cp>::layout;
  using Norm = nn::Normalize<T, typename Local::layout>;  // no affine parameters: the modulation's instead
  using HeadNorm = nn::LayerNorm<T, typename Local::layout>;
  using Mod = nn::Modulation<T, typename Local::layout>;
  using Gate = nn::Gate<T, typename Local::layout>;
  using Attn = nn::GroupedQueryAttention<T, recompute::None, Host, Cx, mask::Bidirectional>;
  using Mlp = nn::Mlp<T>;
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;
  using AttnInner = nn::Sequential<on_rows<nn::Named<"ln1", Norm>>, on_rows<nn::Named<"mod1", Mod>>, Enter,
                                   nn::Named<"attn", Attn>, Leave, on_rows<nn::Named<"gate1", Gate>>>;
  using MlpSeq = nn::Sequential<nn::Named<"ln2", Norm>, nn::Named<"mod2", Mod>, typename Local::enter,
                                nn::Named<"mlp", Mlp>, typename Local::leave, nn::Named<"gate2", Gate>>;
  using MlpInner = on_rows<MlpSeq>;
  using Block = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Embedding = CondEmbedding<SP, Cx>;
  using Head = nn::MseHeadStage<T, SP, &Conditioned::y, Host, HeadNorm, Cx>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "conditioned"; }
  static std::int64_t side_width(const Config& c) { return c.side; }
  static void validate(const Config&, const Spread&, std::int64_t) {}
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
    return {{"layers", c.layers}, {"width", c.width}, {"side", c.side}};
  }
  static std::string block_name(std::int64_t l) { return cat("h", l); }
  static Embedding make_embedding(Host& dev, const Config& c, const Spread& s) { return Embedding(dev, c, s); }
  static Block make_block(Host& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 32 * l);  // 32 ids a block: norms, attn, mlp, mods, gates
    const double sd = c.init_std;
    return Block(
        nn::Residual<AttnInner>(AttnInner(
            on_rows<nn::Named<"ln1", Norm>>(nn::Named<"ln1", Norm>(Norm(dev, c.width, s, id, c.seed))),
            on_rows<nn::Named<"mod1", Mod>>(nn::Named<"mod1", Mod>(Mod(dev, c.width, c.side, s, id + 12, c.seed, sd))),
            {},
            nn::Named<"attn", Attn>(
                Attn(dev, c.width, c.heads, c.heads, std::nullopt, false, s, id + 4, c.seed, sd, sd)),
            {},
            on_rows<nn::Named<"gate1", Gate>>(
                nn::Named<"gate1", Gate>(Gate(dev, c.width, c.side, s, id + 16, c.seed, sd))))),
        nn::Residual<MlpInner>(
            MlpInner(MlpSeq(nn::Named<"ln2", Norm>(Norm(dev, c.width, s, id + 2, c.seed)),
                            nn::Named<"mod2", Mod>(Mod(dev, c.width, c.side, s, id + 14, c.seed, sd)), {},
                            nn::Named<"mlp", Mlp>(Mlp(dev, c.width, s, id + 8, c.seed, sd, sd)), {},
                            nn::Named<"gate2", Gate>(Gate(dev, c.width, c.side, s, id + 18, c.seed, sd))))));
  }
  static Head make_head(Host& dev, const Config& c, const Spread& s) {
    return Head(dev, c.width, c.out, s, c.seed, 8, 10, c.init_std);
  }
};

template <bool SP, class Cx = context::None>
using Conditional = nn::StagedModel<Spec<SP, Cx>>;

constexpr std::int64_t kMicro = 4;
constexpr int kM = 2;

// Sample g of step s, micro-batch i, drawn from normals keyed by all three: each data rank reads
// its own samples of the same global batches whatever the mesh.
struct CondBatches {
  Config c;
  std::int64_t micro;
  int data, data_rank;
  std::vector<std::vector<double>> x, y, cond;
  template <class C>
  CondBatches(const C& config, std::int64_t micro_batch, int d, int r, int m)
      : c(config), micro(micro_batch), data(d), data_rank(r), x(static_cast<std::size_t>(m)), y(x), cond(x) {}
  nn::Batch<Conditioned> next(int step, int i, double scale) {
    const std::int64_t local = micro / data, first = data_rank * local;
    const auto at = static_cast<std::size_t>(i);
    x[at].clear();
    y[at].clear();
    cond[at].clear();
    for (std::int64_t b = first; b < first + local; ++b) {
      const auto key = static_cast<std::uint64_t>((step * kM + i) * 1000 + b);
      for (auto [into, n, seed] :
           {std::tuple{&x[at], c.seq * c.in, 100 + key}, std::tuple{&y[at], c.seq * c.out, 5000 + key},
            std::tuple{&cond[at], c.cond, 9000 + key}}) {
        const auto v = test::normals(static_cast<std::size_t>(n), seed);
        into->insert(into->end(), v.begin(), v.end());
      }
    }
    return {{x[at], y[at], cond[at]}, micro, scale};
  }
};

template <bool SP, class Cx = context::None, class Sched = pipeline::OneFOneB>
test::StepsRun run(int data, int pipe, int context, int tensor, int v = 1) {
  return test::train_steps<Conditional<SP, Cx>, Sched, optim::Ddp, CondBatches>(Config{}, kMicro, kM, pipe, v, tensor,
                                                                                data, 2, context);
}

void check_equal(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what) {
  INFO(what);
  // f64: the same sums in other orders (tensor and data reductions, the context blocks' merge, the
  // side input's shares summed over tensor ranks and pipe stages).
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]));
  std::string where;
  CHECK_MESSAGE(test::worst_tensor(got.grads, ref.grads, where) <= 1e-12, "gradient ", where);
  CHECK_MESSAGE(test::worst_tensor(got.values, ref.values, where) <= 1e-12, "value ", where);
}

}  // namespace

TEST_CASE("a side input's gradient reaches the layer that made it: every gradient matches finite differences") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Conditional<false> model(h, Config{}, mesh.spread(), kMicro);
    CondBatches batches(Config{}, kMicro, 1, 0, 1);
    const auto mb = batches.next(0, 0, 1.0);
    auto loss = [&] {
      auto c = model.in_flight(mb);
      pipeline::forward(model, c, mesh, pipeline::LocalGradients{}, nn::Mode::infer);
      return c.loss;
    };
    model.zero_grad();
    auto ctx = model.in_flight(mb);
    pipeline::forward_backward(model, ctx, mesh);
    std::size_t params = 0;
    bool cond_proj = false;
    model.for_each_param([&](const std::string& name, auto& p) {
      INFO(name);
      const auto r =
          test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                          std::span<const double>(p.grad.data(), static_cast<std::size_t>(p.grad.numel())), loss, 30);
      CHECK(r.checked > 0);
      CHECK(r.worst <= 1e-6);  // support/gradcheck.hpp: central differences in double
      double largest = 0;
      for (std::int64_t i = 0; i < p.grad.numel(); ++i) largest = std::max(largest, std::abs(p.grad.data()[i]));
      CHECK(largest > 1e-6);  // every parameter is used: none is checked at zero alone
      cond_proj = cond_proj || name == "cond_proj.weight";
      ++params;
    });
    CHECK(cond_proj);
    // in_proj and cond_proj (2 each); per block mod1, attn (qkv, proj), gate1, mod2, gate2 (2 each)
    // and mlp (4), its norms none; the head's norm and out_proj (2 each).
    CHECK(params == 4 + 4 * 14 + 4);
  });
}

TEST_CASE("a side input on every layout equals one rank in f64 (1e-12): loss, gradients and weights") {
  const test::StepsRun ref = run<false>(1, 1, 1, 1);
  check_equal(run<false>(1, 1, 1, 2), ref, "tensor 2");
  check_equal(run<true>(1, 1, 1, 2), ref, "tensor 2 with sequence parallelism");
  check_equal(run<false>(2, 1, 1, 1), ref, "DDP over data 2");
  check_equal(run<false>(1, 2, 1, 1), ref, "1F1B over pipe 2");
  check_equal(run<false, context::None, pipeline::Interleaved>(1, 2, 1, 1, 2), ref, "interleaved over pipe 2 x 2");
  check_equal(run<false, context::None, pipeline::ZeroBubbleH1>(1, 2, 1, 1), ref, "ZB-H1 over pipe 2");
  check_equal(run<false, context::Ring>(1, 1, 2, 1), ref, "context 2 (ring)");
  check_equal(run<false, context::AllGather>(1, 1, 2, 1), ref, "context 2 (all-gather)");
  check_equal(run<true, context::Ring>(2, 2, 2, 2), ref, "data 2 x pipe 2 x context 2 x tensor 2 with SP");
}

TEST_CASE("Normalize: rows of mean 0 and variance var / (var + eps), and its input gradient by finite differences") {
  Host h;
  const Spread s{};
  nn::Normalize<double, nn::act::Full> norm(h, 8, s);
  auto x = Tensor<double, nn::act::Full, Host>::empty(h, {2, 3, 8}, s);
  const auto v = test::normals(48, 31, 2.0);
  for (std::int64_t i = 0; i < 48; ++i) x.data()[i] = v[static_cast<std::size_t>(i)] + 0.5;
  typename nn::Normalize<double, nn::act::Full>::Ctx ctx;
  const auto y = norm.forward(ctx, x);
  for (std::int64_t r = 0; r < 6; ++r) {
    double m = 0, var_x = 0, mx = 0, var_y = 0;
    for (std::int64_t c = 0; c < 8; ++c) mx += x.data()[r * 8 + c] / 8, m += y.data()[r * 8 + c] / 8;
    for (std::int64_t c = 0; c < 8; ++c)
      var_x += std::pow(x.data()[r * 8 + c] - mx, 2) / 8, var_y += std::pow(y.data()[r * 8 + c] - m, 2) / 8;
    CHECK(std::abs(m) <= 1e-14);
    CHECK(var_y == doctest::Approx(var_x / (var_x + 1e-6)).epsilon(1e-12));  // eps 1e-6, DiT's
  }
  const auto R = test::normals(48, 32);
  auto dy = Tensor<double, nn::act::Full, Host>::empty(h, {2, 3, 8}, s);
  std::copy(R.begin(), R.end(), dy.data());
  const auto dx = norm.backward(ctx, dy);
  auto loss = [&] {
    typename nn::Normalize<double, nn::act::Full>::Ctx c;
    const auto out = norm.forward(c, x);
    double l = 0;
    for (std::int64_t i = 0; i < 48; ++i) l += out.data()[i] * R[static_cast<std::size_t>(i)];
    return l;
  };
  const auto r = test::gradcheck(std::span<double>(x.data(), 48), std::span<const double>(dx.data(), 48), loss, 48);
  CHECK(r.checked == 48);
  CHECK(r.worst <= 1e-6);
  std::size_t params = 0;
  norm.for_each_param("n", [&](const std::string&, auto&) { ++params; });
  CHECK(params == 0);
}
