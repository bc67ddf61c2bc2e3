// mixtral::Model<Precision, SequenceParallel, Recompute, Device, Dispatcher, Context, ExpertTensor>: Mixtral (Jiang
// et al. 2024): Llama's blocks (models/llama/model.hpp) with a mixture of experts in place of the
// MLP, an instance of nn::StagedModel built from weft's generic layers:
//
//   stage 0         TokenEmbeddingStage: the vocab-parallel table                    "embedding"
//   stage 1 .. L    layers.l: x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))   "layers.<l>", and
//                   attn: GroupedQueryAttention (rotary, kv_heads <= heads)           "layers.<l>.experts"
//                   mlp:  MoeMlp: softmax router over E experts, the top k renormalised,
//                         each expert a SwiGLU of width `hidden` (nn/moe.hpp)
//   stage L + 1     norm (RmsNorm), the LM head, the vocab-parallel cross-entropy    "head"
//
//   tokens  (B, T) int32                      batch split over data
//   x       (B, T, C)  the residual stream: Replicate, or Shard<1> with sequence parallelism
//   experts (E, ...)   ExpertSharded: E / ep a rank of the expert group (carved from data x context);
//                      ExpertTensor::sharded: each expert's hidden features split over tensor too
//                      (gate_up (E/ep, 2H/tp, C), down (E/ep, C, H/tp)), the MLP branch entered and
//                      left as Llama's (Local::enter, Local::leave: nn/moe.hpp)
//
// The loss a step's gradients follow is the cross-entropy plus, for each layer, aux_coef times its
// load-balancing loss and z_coef times its z-loss (per layer, as Megatron-Core's; transformers'
// MixtralForCausalLM pools the layers' statistics before the product: docs/moe.md). Parameter ids:
// as Llama's (block l from 16 + 16 l: attn_norm +0, qkv +1, proj +3, mlp_norm +5), the router +6,
// the experts' gate-up +7 and down +8.
//
// defines: mixtral::Config, mixtral::record, mixtral::validate, mixtral::Spec, mixtral::Model
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "weft/models/llama/config.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/nn/moe.hpp"

namespace weft::mixtral {

// Llama's sizes (hidden: each expert's width, transformers' intermediate_size) and the router's:
// past transformers' Mixtral, sigmoid scores and an expert bias moved by its rate each step
// (aux-loss-free balancing, DeepSeek-V3's: docs/moe.md), and the chosen weights' scale; the
// routers transformers' Mixtral and Qwen3-MoE directories hold are softmax, without a bias.
struct Config : llama::Config {
  std::int64_t experts = 4, top_k = 2;  // num_local_experts, num_experts_per_tok
  double aux_coef = 0.001, z_coef = 0;  // router_aux_loss_coef (transformers' default); the z-loss's
  double capacity_factor = 0;           // 0: dropless; > 0 a capacity per sample and expert (nn/moe.hpp)
  nn::Score score = nn::Score::softmax;
  double scale = 1;
  bool expert_bias = false;
  double bias_rate = 1e-3;
  std::int64_t groups = 1, top_groups = 1;  // group-limited routing (DeepSeek-V3's n_group, topk_group)

  nn::MoeOptions moe() const {
    return {.experts = experts,
            .top_k = top_k,
            .hidden = hidden,
            .capacity_factor = capacity_factor,
            .aux_coef = aux_coef,
            .z_coef = z_coef,
            .score = score,
            .scale = scale,
            .expert_bias = expert_bias,
            .bias_rate = bias_rate,
            .groups = groups,
            .top_groups = top_groups};
  }
  // Whether the router is the one transformers' MixtralForCausalLM and Qwen3MoeForCausalLM hold.
  bool softmax_router() const { return score == nn::Score::softmax && scale == 1 && !expert_bias && groups == 1; }
};

inline std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
  auto r = llama::record(c);
  r.emplace_back("experts", c.experts);
  r.emplace_back("top_k", c.top_k);
  r.emplace_back("aux_coef_x1e9", llama::scaled(c.aux_coef, 1e9));
  r.emplace_back("z_coef_x1e9", llama::scaled(c.z_coef, 1e9));
  r.emplace_back("capacity_factor_x1e6", llama::scaled(c.capacity_factor, 1e6));
  // Recorded where they differ from transformers' router only (earlier checkpoints' records hold
  // none of them, and read back as that router). The bias's rate is the run's to choose, as the
  // learning rate is (DeepSeek-V3 sets it to 0 late in training): not recorded.
  if (c.score == nn::Score::sigmoid) r.emplace_back("router_sigmoid", 1);
  if (c.scale != 1) r.emplace_back("router_scale_x1e6", llama::scaled(c.scale, 1e6));
  if (c.expert_bias) r.emplace_back("expert_bias", 1);
  if (c.groups != 1) r.emplace_back("router_groups", c.groups), r.emplace_back("router_top_groups", c.top_groups);
  return r;
}

inline void validate(const Config& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  llama::validate(c, s, sequence_parallel, batch);
  if (c.experts < 1 || c.top_k < 1 || c.top_k > c.experts || c.experts % s.expert_degree != 0)
    throw Error("Mixtral", cat(c.experts, " experts, top ", c.top_k, ", over an expert degree of ", s.expert_degree),
                "use a top-k from 1 to the experts, and an expert degree that divides the experts");
  if (!(c.capacity_factor >= 0) || !(c.aux_coef >= 0) || !(c.z_coef >= 0))
    throw Error(
        "Mixtral",
        cat("capacity factor ", c.capacity_factor, ", aux coefficient ", c.aux_coef, ", z coefficient ", c.z_coef),
        "use a capacity factor of 0 (dropless) or above, and coefficients of 0 or above");
  if (c.score == nn::Score::sigmoid && c.z_coef > 0)
    throw Error("Mixtral", cat("a z-loss (coefficient ", c.z_coef, ") with sigmoid router scores"),
                "train a sigmoid router without the z-loss (z coefficient 0)");
  if (!(c.scale > 0) || !(c.bias_rate >= 0) || !std::isfinite(c.scale) || !std::isfinite(c.bias_rate))
    throw Error("Mixtral", cat("router scale ", c.scale, ", expert-bias rate ", c.bias_rate),
                "use a positive scale (1: none) and a rate of 0 or more (DeepSeek-V3: 1e-3)");
  if (c.groups != 1 &&
      (c.groups < 1 || c.groups > math::kMaxExpertGroups || c.experts % c.groups != 0 || c.experts / c.groups < 2))
    throw Error(
        "Mixtral", cat(c.experts, " experts in ", c.groups, " groups (--expert-groups)"),
        cat("use groups that divide the experts into groups of 2 or more (at most ", math::kMaxExpertGroups, ")"));
  if (c.top_groups < 1 || c.top_groups > c.groups || c.top_k > c.top_groups * (c.experts / c.groups))
    throw Error("Mixtral",
                cat("top ", c.top_k, " from ", c.top_groups, " of ", c.groups, " groups of ", c.experts / c.groups,
                    " experts (--top-groups)"),
                "choose from 1 to the groups, enough of them to hold the top-k experts");
}

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          nn::ExpertDispatch Dispatcher = nn::AllToAllDispatch, context::Choice Cx = context::None,
          nn::ExpertTensor ET = nn::ExpertTensor::whole>
struct Spec : llama::Spec<P, SP, Recompute, D, false, Cx> {
  using Base = llama::Spec<P, SP, Recompute, D, false, Cx>;
  using typename Base::AttnInner;
  using typename Base::Local;
  using typename Base::Norm;
  using typename Base::T;
  template <class L>
  using on_rows = typename Base::template on_rows<L>;
  using config = Config;
  static constexpr bool split = ET == nn::ExpertTensor::sharded;
  // The experts on the stream's rows; split over tensor (expert-tensor parallelism), on every row of
  // the tensor group as Llama's MLP is (Local::enter before, Local::leave after: nn/moe.hpp).
  using Experts = nn::MoeMlp<T, std::conditional_t<split, typename Local::enter::Out, typename Local::layout>, D,
                             Dispatcher, ET, typename Base::G>;
  using Mlp = std::conditional_t<split,
                                 nn::Sequential<nn::Named<"mlp_norm", Norm>, typename Local::enter,
                                                nn::Named<"mlp", Experts>, typename Local::leave>,
                                 nn::Sequential<nn::Named<"mlp_norm", Norm>, nn::Named<"mlp", Experts>>>;
  using MlpInner = on_rows<Mlp>;
  using Layer = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Block = recompute::apply_t<Recompute, Layer, T, D>;

  static std::string name() { return "Mixtral"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) { mixtral::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return mixtral::record(c); }

  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std;
    return Layer(
        nn::Residual<AttnInner>(AttnInner(on_rows<nn::Named<"attn_norm", Norm>>(nn::Named<"attn_norm", Norm>(
                                              Norm(dev, c.width, s, id, c.seed, c.norm_eps))),
                                          {},
                                          nn::Named<"attn", typename Base::Attn>(typename Base::Attn(
                                              dev, c.width, c.heads, c.kv_heads, c.rope, s, id + 1, c.seed, sd, sd)),
                                          {})),
        nn::Residual<MlpInner>(MlpInner(make_mlp(dev, c, s, l))));
  }
  // The MLP branch: mlp_norm, then the experts (router +6, gate-up +7, down +8) as c.moe() says (a
  // template: a derived family's configuration, qwen3_moe::Config, gives its own moe()).
  template <class Cfg>
  static Mlp make_mlp(D& dev, const Cfg& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    auto norm = nn::Named<"mlp_norm", Norm>(Norm(dev, c.width, s, id + 5, c.seed, c.norm_eps));
    auto experts = nn::Named<"mlp", Experts>(Experts(dev, c.width, c.moe(), s, id + 6, c.seed, c.init_std, c.init_std));
    if constexpr (split) return Mlp(std::move(norm), {}, std::move(experts), {});
    else return Mlp(std::move(norm), std::move(experts));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          nn::ExpertDispatch Dispatcher = nn::AllToAllDispatch, context::Choice Cx = context::None,
          nn::ExpertTensor ET = nn::ExpertTensor::whole>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Dispatcher, Cx, ET>>;

}  // namespace weft::mixtral
