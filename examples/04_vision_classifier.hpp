// A small vision transformer classifying synthetic images: a model with a batch, a head and a loss of
// its own, on weft's public headers (docs/models.md, section 8). Every layout applies to it.
#pragma once

#include <weft/weft_host.hpp>

#include <cmath>
#include <numeric>
#include <random>

namespace vit {
using namespace weft;
using u = std::size_t;

struct Config {
  std::int64_t seq = 16, layers = 2, width = 32, heads = 4, patch = 4, classes = 4;  // 16 patches of 2 x 2
  std::uint64_t seed = 5;
  double init_std = 0.1;
};

struct Images {                          // one micro-batch: this data rank's B/dp images
  std::span<const double> patches;       // (B/dp, seq, patch): pixel values, patch by patch
  std::span<const std::int32_t> labels;  // (B/dp)
  template <class F> void for_each_field(F&& f) { f("patches", patches), f("labels", labels); }
  void check(const Config& c, std::int64_t b, const std::string& where) const {
    nn::check_field(patches, b * c.seq * c.patch, "patches", where, "seq x patch");
    nn::check_field(labels, b, "labels", where, "1");
    for (std::int32_t y : labels)
      if (y < 0 || y >= c.classes)
        throw Error(where, cat("a label ", y, " of ", c.classes, " classes"), "fix the data");
  }
};

// The head: pooled (B, C) = the mean of the rows, summed over the ranks that split them (context, and
// tensor under SP); the mean cross-entropy of logits = pooled W^T + b. Every tensor rank keeps the whole
// (replicated) gradient, one context rank adds it (the data-parallel step sums over context).
template <bool SP, class Cx>
struct ClassifierHead {
  static constexpr bool cp = context::Kind<Cx>;
  using A = typename nn::stream<SP, cp>::layout;
  struct Ctx {  // pooled (B/dp, C); dz = B dloss/dlogits (B/dp, classes); the stream's rows on this rank
    std::vector<double> pooled, dz;
    std::int64_t rows = 0;
  };
  nn::Param<double, Replicated, Replicated, Host> w, b;  // (classes, C), (classes)
  ClassifierHead() = default;
  ClassifierHead(Host& h, const Config& c, const Spread& s)
      : w(h, {c.classes, c.width}, s, 8, {nn::Init::normal, c.init_std}, c.seed, nn::Decay::yes),
        b(h, {c.classes}, s, 9, {nn::Init::zeros}, c.seed, nn::Decay::no) {}
  template <class Batch, AxisComms M>
  double forward(Ctx& ctx, const Tensor<double, A, Host>& x, const Batch& in, M& mesh, nn::Mode = nn::Mode::train) {
    const std::int64_t C = x.local_shape()[2], K = w.value.global_shape()[0];
    ctx.rows = x.local_shape()[1];
    ctx.pooled.assign(u(x.local_shape()[0] * C), 0.0);
    for (std::int64_t i = 0; i < x.numel(); ++i) ctx.pooled[u(i / (ctx.rows * C) * C + i % C)] += x.data()[i];
    for (double& p : ctx.pooled) p /= static_cast<double>(x.global_shape()[1]);
    if constexpr (cp) mesh.comm(Axis::context).all_reduce(std::span<double>(ctx.pooled));
    if constexpr (SP) mesh.comm(Axis::tensor).all_reduce(std::span<double>(ctx.pooled));
    ctx.dz.assign(u(x.local_shape()[0] * K), 0.0);
    std::array<double, 1> loss{0.0};
    for (std::int64_t i = 0; i < x.local_shape()[0]; ++i) {
      double *z = ctx.dz.data() + i * K, sum = 0;
      for (std::int64_t k = 0; k < K; ++k)
        z[k] = std::inner_product(w.value.data() + k * C, w.value.data() + (k + 1) * C, &ctx.pooled[u(i * C)],
                                  b.value.data()[k]);
      const double mx = *std::max_element(z, z + K);
      for (std::int64_t k = 0; k < K; ++k) sum += std::exp(z[k] - mx);
      loss[0] += std::log(sum) + mx - z[in.labels[u(i)]];
      for (std::int64_t k = 0; k < K; ++k) z[k] = std::exp(z[k] - mx) / sum - (k == in.labels[u(i)]);
    }
    mesh.comm(Axis::data).all_reduce(std::span<double>(loss));
    return loss[0] / static_cast<double>(in.batch);
  }
  template <AxisComms M>
  Tensor<double, A, Host> backward(Ctx& ctx, double grad_scale, M&) {
    const Spread& s = w.value.spread();
    const std::int64_t K = w.value.global_shape()[0], C = w.value.global_shape()[1], Bl = std::ssize(ctx.dz) / K,
                       T = ctx.rows * (cp ? s.context_degree : 1) * (SP ? s.tensor_degree : 1);
    auto dx = Tensor<double, A, Host>::zeros(w.value.dev(), {Bl * s.data_degree, T, C}, s, Category::activations);
    for (std::int64_t i = 0; i < Bl; ++i)
      for (std::int64_t k = 0; k < K; ++k) {
        const double g = ctx.dz[u(i * K + k)] * grad_scale / static_cast<double>(Bl * s.data_degree);
        if (s.context_index == 0) b.grad.data()[k] += g;
        for (std::int64_t c = 0; c < C; ++c) {
          if (s.context_index == 0) w.grad.data()[k * C + c] += g * ctx.pooled[u(i * C + c)];
          for (std::int64_t t = 0; t < ctx.rows; ++t)
            dx.data()[(i * ctx.rows + t) * C + c] += g * w.value.data()[k * C + c] / T;
        }
      }
    return dx;
  }
  template <class F> void for_each_param(const std::string& p, F&& f) { f(p + "head.w", w), f(p + "head.b", b); }
};

template <bool SP, class Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>, sequence_parallel = SP;
  using precision = precision_t<F64>;
  using T = double;
  using config = Config;
  using device = Host;
  using Inputs = Images;
  using Local = nn::stream<SP>;
  using A = typename nn::stream<SP, cp>::layout;
  using Norm = nn::LayerNorm<T, typename Local::layout>;
  using Attn = nn::GroupedQueryAttention<T, recompute::None, Host, Cx, mask::Bidirectional>;
  template <class L> using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;  // the rank's rows under Cx
  using AttnPart = nn::Sequential<on_rows<nn::Named<"ln1", Norm>>, typename nn::stream<SP, cp>::enter,
                                  nn::Named<"attn", Attn>, typename nn::stream<SP, cp>::leave>;
  using MlpSeq = nn::Sequential<nn::Named<"ln2", Norm>, typename Local::enter, nn::Named<"mlp", nn::Mlp<T>>,
                                typename Local::leave>;
  using Block = nn::Sequential<nn::Residual<AttnPart>, nn::Residual<on_rows<MlpSeq>>>;
  using Embedding = nn::FeatureEmbeddingStage<T, SP, &Images::patches, Host, Cx>;
  using Head = ClassifierHead<SP, Cx>;
  static std::string name() { return "vit"; }
  static void validate(const Config&, const Spread&, std::int64_t) {}  // weft's layers check their sizes
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
    return {{"layers", c.layers}, {"width", c.width}, {"classes", c.classes}};
  }
  static std::string block_name(std::int64_t l) { return cat("blocks.", l); }
  static Embedding make_embedding(Host& h, const Config& c, const Spread& s) {
    return Embedding(h, c.patch, c.width, s, c.seed, c.init_std);
  }
  static Block make_block(Host& h, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std;
    using Ln = nn::Named<"ln1", Norm>;
    return Block(nn::Residual<AttnPart>(AttnPart(
                     on_rows<Ln>(Ln(Norm(h, c.width, s, id, c.seed))), {},
                     nn::Named<"attn", Attn>(Attn::multi_head(h, c.width, c.heads, s, id + 2, c.seed, sd, sd)), {})),
                 nn::Residual<on_rows<MlpSeq>>(on_rows<MlpSeq>(
                     MlpSeq(nn::Named<"ln2", Norm>(Norm(h, c.width, s, id + 6, c.seed)), {},
                            nn::Named<"mlp", nn::Mlp<T>>(nn::Mlp<T>(h, c.width, s, id + 8, c.seed, sd, sd)), {}))));
  }
  static Head make_head(Host& h, const Config& c, const Spread& s) { return Head(h, c, s); }
};
template <bool SP, class Cx = context::None>
using Model = nn::StagedModel<Spec<SP, Cx>>;

// Synthetic images: class k's pattern plus noise, drawn from (step, micro-batch, sample): any mesh, the same batches.
struct Data {
  Config c;
  std::int64_t micro;
  int data, data_rank, m;
  std::vector<std::vector<double>> x = std::vector<std::vector<double>>(u(m));
  std::vector<std::vector<std::int32_t>> y = std::vector<std::vector<std::int32_t>>(u(m));
  nn::Batch<Images> next(int step, int i, double scale) {
    x[u(i)].clear(), y[u(i)].clear();
    for (std::int64_t b = data_rank * micro / data; b < (data_rank + 1) * micro / data; ++b) {
      std::mt19937_64 rng(static_cast<std::uint64_t>((step * 64 + i) * 4096 + b));
      y[u(i)].push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c.classes)));
      std::mt19937_64 pattern(static_cast<std::uint64_t>(1000 + y[u(i)].back()));
      std::normal_distribution<double> unit, noise(0.0, 0.5);
      for (std::int64_t p = 0; p < c.seq * c.patch; ++p) x[u(i)].push_back(unit(pattern) + noise(rng));
    }
    return {{x[u(i)], y[u(i)]}, micro, scale};
  }
};

}  // namespace vit
