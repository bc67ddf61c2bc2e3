// The test feature model (tests/nn/feature_model.cpp; its padded form on the GPU in tests/nn/gpu.cu):
// a vector of features at each position in (nn::FeatureEmbeddingStage over the batch's field x),
// bidirectional attention blocks (GPT-2's layer without biases, mask::Bidirectional), a vector of
// values at each position out with the mean squared error against the batch's field y
// (nn::MseHeadStage). Its batch: FeaturesOf<E>, or PaddedFeaturesOf<E> with each sample's length
// (nn/padding.hpp). Written over the element type and the device. With Moe, each block's MLP is a
// mixture of experts (nn::MoeMlp over the rank's rows, Config::moe), its tokens reaching experts on
// other ranks Dispatcher's way. Its blocks under any recompute policy (Recompute).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/nn/feature_stages.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/mlp.hpp"
#include "weft/nn/moe.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/recompute/checkpointed.hpp"

namespace weft::test::feature {

struct Config {
  std::int64_t seq = 8, layers = 2, width = 16, heads = 2, in = 6, out = 3;
  std::uint64_t seed = 7;
  double init_std = 0.3;
  nn::MoeOptions moe{.experts = 4, .top_k = 2, .hidden = 8, .aux_coef = 0.1, .z_coef = 0.01};  // Spec<.., Moe>'s
};

// The batch: features in and target values out at each position.
template <class E>
struct FeaturesOf {
  std::span<const E> x, y;  // (B/dp, T, in), (B/dp, T, out)
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

// The same batch padded at the end: sample b's positions from lengths[b] on are padding
// (nn/padding.hpp), left out of the attention's keys and the loss.
template <class E>
struct PaddedFeaturesOf {
  std::span<const E> x, y;                // (B/dp, T, in), (B/dp, T, out)
  std::span<const std::int32_t> lengths;  // (B/dp)
  template <class F>
  void for_each_field(F&& f) {
    f("x", x);
    f("y", y);
    f("lengths", lengths);
  }
  void check(const Config& c, std::int64_t b, const std::string& where) const {
    FeaturesOf<E>{x, y}.check(c, b, where);
    nn::check_field(lengths, b, "lengths", where, "1");
  }
};

template <bool SP, class Cx = context::None, class In = FeaturesOf<double>, class T = double, class D = Host,
          bool Moe = false, class Dispatcher = nn::AllToAllDispatch, recompute::Policy Recompute = recompute::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;
  using precision = precision_t<T>;
  using config = Config;
  using device = D;
  using Inputs = In;
  using Local = nn::stream<SP>;
  using A = typename nn::stream<SP, cp>::layout;
  using Norm = nn::LayerNorm<T, typename Local::layout, D>;
  using Attn = nn::GroupedQueryAttention<T, Recompute, D, Cx, mask::Bidirectional>;
  using Mlp = nn::Mlp<T, D>;
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;
  using AttnInner = nn::Sequential<on_rows<nn::Named<"ln1", Norm>>, Enter, nn::Named<"attn", Attn>, Leave>;
  using Experts = nn::MoeMlp<T, typename Local::layout, D, Dispatcher>;
  using MlpSeq = std::conditional_t<
      Moe, nn::Sequential<nn::Named<"ln2", Norm>, nn::Named<"moe", Experts>>,
      nn::Sequential<nn::Named<"ln2", Norm>, typename Local::enter, nn::Named<"mlp", Mlp>, typename Local::leave>>;
  using MlpInner = on_rows<MlpSeq>;
  using Layer = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Block = recompute::apply_t<Recompute, Layer, T, D>;
  using Embedding = nn::FeatureEmbeddingStage<T, SP, &In::x, D, Cx>;
  using Head = nn::MseHeadStage<T, SP, &In::y, D, Norm, Cx>;
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
  static Embedding make_embedding(D& dev, const Config& c, const Spread& s) {
    return Embedding(dev, c.in, c.width, s, c.seed, c.init_std);
  }
  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    return Layer(nn::Residual<AttnInner>(AttnInner(
                     on_rows<nn::Named<"ln1", Norm>>(nn::Named<"ln1", Norm>(Norm(dev, c.width, s, id, c.seed))), {},
                     nn::Named<"attn", Attn>(Attn(dev, c.width, c.heads, c.heads, std::nullopt, false, s, id + 4,
                                                  c.seed, c.init_std, c.init_std)),
                     {})),
                 nn::Residual<MlpInner>(MlpInner(mlp(dev, c, s, id))));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
  static MlpSeq mlp(D& dev, const Config& c, const Spread& s, std::uint64_t id) {
    nn::Named<"ln2", Norm> ln2(Norm(dev, c.width, s, id + 2, c.seed));
    if constexpr (Moe)
      return MlpSeq(std::move(ln2),
                    nn::Named<"moe", Experts>(Experts(dev, c.width, c.moe, s, id + 8, c.seed, c.init_std, c.init_std)));
    else
      return MlpSeq(std::move(ln2), {},
                    nn::Named<"mlp", Mlp>(Mlp(dev, c.width, s, id + 8, c.seed, c.init_std, c.init_std)), {});
  }
  static Head make_head(D& dev, const Config& c, const Spread& s) {
    return Head(dev, c.width, c.out, s, c.seed, 8, 10, c.init_std);
  }
};

}  // namespace weft::test::feature
