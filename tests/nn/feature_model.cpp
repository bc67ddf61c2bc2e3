// A model that is not tokens in / cross-entropy out, written on weft's public headers as a user
// would: a vector of features at each position in (nn::FeatureEmbeddingStage over the batch's
// field x), bidirectional attention blocks (GPT-2's layer, its attention without biases and with
// mask::Bidirectional), a vector of
// values at each position out with the mean squared error against the batch's field y
// (nn::MseHeadStage), its batch a record of two float fields (nn::Batch<Features>).
//
// Checked: the loss against its closed form (the head's projection zeroed: the mean of y^2), every
// gradient against finite differences on one rank, and every layout against one rank in f64
// (1e-12): tensor 2 with and without sequence parallelism, DDP, ZeRO-1 and FSDP over data 2, a
// 1F1B pipeline over 2 ranks, context 2 (ring and all-gather), and mixes of them; fields of the
// wrong size refused by name.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"
#include "weft/nn/feature_stages.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/mlp.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/pipeline/executor.hpp"

using namespace weft;

namespace {

struct Config {
  std::int64_t seq = 8, layers = 2, width = 16, heads = 2, in = 6, out = 3;
  std::uint64_t seed = 7;
  double init_std = 0.3;
};

// The batch: features in and target values out at each position.
struct Features {
  std::span<const double> x, y;  // (B/dp, T, in), (B/dp, T, out)
  template <class F>
  void for_each_field(F&& f) {
    f("x", x);
    f("y", y);
  }
  void check(const Config& c, std::int64_t b, const std::string& where) const {
    nn::check_field(x, b * c.seq * c.in, "x", where, cat("seq x in (", c.seq * c.in, ")"));
    nn::check_field(y, b * c.seq * c.out, "y", where, cat("seq x out (", c.seq * c.out, ")"));
  }
};

template <bool SP, class Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;
  using precision = precision_t<F64>;
  using T = double;
  using config = Config;
  using device = Host;
  using Inputs = Features;
  using Local = nn::stream<SP>;
  using A = typename nn::stream<SP, cp>::layout;
  using Norm = nn::LayerNorm<T, typename Local::layout>;
  using Attn = nn::GroupedQueryAttention<T, recompute::None, Host, Cx, mask::Bidirectional>;
  using Mlp = nn::Mlp<T>;
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;
  using AttnInner = nn::Sequential<on_rows<nn::Named<"ln1", Norm>>, Enter, nn::Named<"attn", Attn>, Leave>;
  using MlpSeq =
      nn::Sequential<nn::Named<"ln2", Norm>, typename Local::enter, nn::Named<"mlp", Mlp>, typename Local::leave>;
  using MlpInner = on_rows<MlpSeq>;
  using Block = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Embedding = nn::FeatureEmbeddingStage<T, SP, &Features::x, Host, Cx>;
  using Head = nn::MseHeadStage<T, SP, &Features::y, Host, Norm, Cx>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "regressor"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) {
    if (c.heads % s.tensor_degree != 0 || batch % s.data_degree != 0 ||
        c.seq % (2 * s.context_degree * (SP ? s.tensor_degree : 1)) != 0)
      throw Error("regressor", "a mesh that does not divide the heads, the batch or the sequence", "use another mesh");
  }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
    return {{"seq", c.seq}, {"layers", c.layers}, {"width", c.width}, {"heads", c.heads}, {"in", c.in}, {"out", c.out}};
  }
  static std::string block_name(std::int64_t l) { return cat("h", l); }
  static Embedding make_embedding(Host& dev, const Config& c, const Spread& s) {
    return Embedding(dev, c.in, c.width, s, c.seed, c.init_std);
  }
  static Block make_block(Host& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    return Block(nn::Residual<AttnInner>(AttnInner(
                     on_rows<nn::Named<"ln1", Norm>>(nn::Named<"ln1", Norm>(Norm(dev, c.width, s, id, c.seed))), {},
                     nn::Named<"attn", Attn>(Attn(dev, c.width, c.heads, c.heads, std::nullopt, false, s, id + 4,
                                                  c.seed, c.init_std, c.init_std)),
                     {})),
                 nn::Residual<MlpInner>(MlpInner(
                     MlpSeq(nn::Named<"ln2", Norm>(Norm(dev, c.width, s, id + 2, c.seed)), {},
                            nn::Named<"mlp", Mlp>(Mlp(dev, c.width, s, id + 8, c.seed, c.init_std, c.init_std)), {}))));
  }
  static Head make_head(Host& dev, const Config& c, const Spread& s) {
    return Head(dev, c.width, c.out, s, c.seed, 8, 10, c.init_std);
  }
};

template <bool SP, class Cx = context::None>
using Regressor = nn::StagedModel<Spec<SP, Cx>>;

const Config kConfig{};
constexpr std::int64_t kMicro = 4;
constexpr int kM = 2;

// Sample g of step s, micro-batch i: x and y drawn from normals keyed by all three, so that every
// data rank reads its own samples of the same global batches whatever the mesh.
struct FeatureBatches {
  Config c;
  std::int64_t micro;
  int data, data_rank;
  std::vector<std::vector<double>> x, y;
  template <class C>
  FeatureBatches(const C& config, std::int64_t micro_batch, int d, int r, int m)
      : c(config), micro(micro_batch), data(d), data_rank(r), x(static_cast<std::size_t>(m)), y(x) {}
  nn::Batch<Features> next(int step, int i, double scale) {
    const std::int64_t local = micro / data, first = data_rank * local;
    auto& xs = x[static_cast<std::size_t>(i)];
    auto& ys = y[static_cast<std::size_t>(i)];
    xs.clear();
    ys.clear();
    for (std::int64_t b = first; b < first + local; ++b) {
      const auto key = static_cast<std::uint64_t>((step * kM + i) * 1000 + b);
      const auto xb = test::normals(static_cast<std::size_t>(c.seq * c.in), 100 + key);
      const auto yb = test::normals(static_cast<std::size_t>(c.seq * c.out), 5000 + key);
      xs.insert(xs.end(), xb.begin(), xb.end());
      ys.insert(ys.end(), yb.begin(), yb.end());
    }
    return {{xs, ys}, micro, scale};
  }
};

template <bool SP, class Cx = context::None, class Strategy = optim::Ddp>
test::StepsRun run(int data, int pipe, int context, int tensor) {
  return test::train_steps<Regressor<SP, Cx>, pipeline::OneFOneB, Strategy, FeatureBatches>(
      kConfig, kMicro, kM, pipe, 1, tensor, data, 2, context);
}

void check_equal(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what, bool sharded = false) {
  INFO(what);
  // f64: the same sums in other orders (tensor and data reductions, the context blocks' merge).
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * std::abs(ref.losses[i]));
  std::string where;
  if (!got.grads.empty() || !sharded)  // the sharded strategies keep slices of the gradients
    CHECK_MESSAGE(test::worst_tensor(got.grads, ref.grads, where) <= 1e-12, "gradient ", where);
  // The values after two AdamW steps as one vector (max difference over max value). (The attention
  // has no biases: a key bias's exact gradient is zero, and Adam would turn its rounding noise into
  // updates of 1e-11 that differ between layouts; tests/pipeline/equivalence.cpp.)
  double diff = 0, scale = 0;
  for (const auto& [name, v] : ref.values)
    for (std::size_t i = 0; i < v.size(); ++i) {
      diff = test::worse(diff, std::abs(got.values.at(name).at(i) - v[i]));
      scale = std::max(scale, std::abs(v[i]));
    }
  CHECK(got.values.size() == ref.values.size());
  CHECK(diff / scale <= 1e-12);
  MESSAGE(what, ": values after two steps within ", diff / scale);
}

}  // namespace

TEST_CASE("a feature model's loss is the mean squared error: with the projection zeroed, the mean of y^2") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Regressor<false> model(h, kConfig, mesh.spread(), kMicro);
    ops::Memory<Host>::fill(h, model.head.weight.value.data(), model.head.weight.value.numel(), 0.0);
    FeatureBatches batches(kConfig, kMicro, 1, 0, 1);
    const auto mb = batches.next(0, 0, 1.0);
    auto ctx = model.in_flight(mb);
    pipeline::forward(model, ctx, mesh, pipeline::LocalGradients{}, nn::Mode::infer);
    double sum = 0;
    for (double v : batches.y[0]) sum += v * v;
    // A sum of 96 squares in another order: rounding alone.
    CHECK(ctx.loss == doctest::Approx(sum / static_cast<double>(batches.y[0].size())).epsilon(1e-14));
    CHECK(ctx.loss > 0.5);  // unit normals: about 1
  });
}

TEST_CASE("a feature model's gradients match finite differences on one rank") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Regressor<false> model(h, kConfig, mesh.spread(), kMicro);
    FeatureBatches batches(kConfig, kMicro, 1, 0, 1);
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
    model.for_each_param([&](const std::string& name, auto& p) {
      INFO(name);
      const auto r =
          test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                          std::span<const double>(p.grad.data(), static_cast<std::size_t>(p.grad.numel())), loss, 40);
      CHECK(r.checked > 0);
      CHECK(r.worst <= 1e-6);  // support/gradcheck.hpp: central differences in double
      ++params;
    });
    // in_proj (2), per block ln1 (2), attn (qkv, proj: 2), ln2 (2), mlp (4), and the head's norm (2)
    // and out_proj (2).
    CHECK(params == 2 + 2 * 10 + 4);
  });
}

TEST_CASE("a feature model on every layout equals one rank in f64 (1e-12): loss, gradients and weights") {
  const test::StepsRun ref = run<false>(1, 1, 1, 1);
  check_equal(run<false>(1, 1, 1, 2), ref, "tensor 2");
  check_equal(run<true>(1, 1, 1, 2), ref, "tensor 2 with sequence parallelism");
  check_equal(run<false>(2, 1, 1, 1), ref, "DDP over data 2");
  check_equal(run<false, context::None, optim::Zero1>(2, 1, 1, 1), ref, "ZeRO-1 over data 2", true);
  check_equal(run<false, context::None, optim::Fsdp>(2, 1, 1, 1), ref, "FSDP over data 2", true);
  check_equal(run<false>(1, 2, 1, 1), ref, "1F1B over pipe 2");
  check_equal(run<false, context::Ring>(1, 1, 2, 1), ref, "context 2 (ring)");
  check_equal(run<false, context::AllGather>(1, 1, 2, 1), ref, "context 2 (all-gather)");
  check_equal(run<true, context::Ring>(2, 2, 2, 2), ref, "data 2 x pipe 2 x context 2 x tensor 2 with SP");
}

TEST_CASE("a feature model refuses fields of the wrong size, naming the field") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Regressor<false> model(h, kConfig, mesh.spread(), kMicro);
    const std::vector<double> x(static_cast<std::size_t>(kMicro * kConfig.seq * kConfig.in)),
        y(static_cast<std::size_t>(kMicro * kConfig.seq * kConfig.out - 1));
    CHECK_THROWS_WITH_AS(model.in_flight({{x, y}, kMicro, 1.0}),
                         "regressor::in_flight: the field 'y' holds 95 values where the local batch needs 96; pass "
                         "(batch / data degree) x seq x out (24) values",
                         Error);
  });
}
