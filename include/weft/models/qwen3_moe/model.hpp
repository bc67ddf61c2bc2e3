// qwen3_moe::Model<Precision, SequenceParallel, Recompute, Device, Dispatcher>: Qwen3-MoE (Qwen team
// 2025), Mixtral's blocks (models/mixtral/model.hpp) with Qwen3's attention, an instance of
// nn::StagedModel built from weft's generic layers:
//
//   stage 0         TokenEmbeddingStage: the vocab-parallel table                    "embedding"
//   stage 1 .. L    layers.l: x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))   "layers.<l>", and
//                   attn: GroupedQueryAttention with heads of head_dim (not C / H)    "layers.<l>.experts"
//                         and QK norm: each head's queries and keys RMS-normalised
//                         over head_dim before the rotation (q_norm, k_norm)
//                   mlp:  MoeMlp: softmax router over E experts, the top k weighted by
//                         their probabilities (renormalised to sum 1 where
//                         norm_topk_prob), each expert a SwiGLU of width `hidden`
//   stage L + 1     norm (RmsNorm), the LM head, the vocab-parallel cross-entropy    "head"
//
//   tokens  (B, T) int32                      batch split over data
//   x       (B, T, C)  the residual stream: Replicate, or Shard<1> with sequence parallelism
//   qkv     (B, T, KV (g + 2) hd / tp)        hd = head_dim; the core (B, T, H hd / tp)
//   experts (E, ...)   ExpertSharded: E / ep a rank of the expert group (carved from data x context)
//
// The loss a step's gradients follow: the cross-entropy plus each layer's aux_coef times its
// load-balancing loss and z_coef times its z-loss, as Mixtral's. Parameter ids: Mixtral's, and the
// attention's q_norm +11 and k_norm +12 of block l's 16 + 16 l. Not yet: the dense layers a
// config's mlp_only_layers or decoder_sparse_step ask for (every layer here has experts; the
// Hugging Face reader refuses others by name), context parallelism (QK norm is not on its path).
//
// defines: qwen3_moe::Config, qwen3_moe::record, qwen3_moe::validate, qwen3_moe::Spec, qwen3_moe::Model
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "weft/models/mixtral/model.hpp"

namespace weft::qwen3_moe {

// Mixtral's sizes (hidden: each expert's width, transformers' moe_intermediate_size) with the head
// size of their own and the router's renormalisation a choice.
struct Config : mixtral::Config {
  std::int64_t head_size = 0;  // head_dim; 0: width / heads
  bool norm_topk_prob = false;

  std::int64_t head_dim() const { return head_size > 0 ? head_size : width / heads; }
  nn::MoeOptions moe() const {
    nn::MoeOptions o = mixtral::Config::moe();
    o.renormalise = norm_topk_prob;
    return o;
  }
};

inline std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
  auto r = mixtral::record(c);
  r.emplace_back("head_dim", c.head_dim());
  r.emplace_back("norm_topk_prob", c.norm_topk_prob ? 1 : 0);
  return r;
}

inline void validate(const Config& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  mixtral::validate(c, s, sequence_parallel, batch);
  if (c.head_size < 0 || c.head_dim() % 2 != 0)
    throw Error("Qwen3-MoE", cat("a head size of ", c.head_dim()), "use an even head_dim (or 0: width / heads)");
}

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          nn::ExpertDispatch Dispatcher = nn::AllToAllDispatch>
struct Spec : mixtral::Spec<P, SP, Recompute, D, Dispatcher> {
  using Base = mixtral::Spec<P, SP, Recompute, D, Dispatcher>;
  using typename Base::Attn;
  using typename Base::AttnInner;
  using typename Base::Block;
  using typename Base::Experts;
  using typename Base::Layer;
  using typename Base::Mlp;
  using typename Base::MlpInner;
  using typename Base::Norm;
  using config = Config;

  static std::string name() { return "Qwen3-MoE"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) { qwen3_moe::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return qwen3_moe::record(c); }

  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std;
    const nn::QkNorm qk{.head_dim = c.head_dim(), .eps = c.norm_eps};
    return Layer(
        nn::Residual<AttnInner>(AttnInner(
            nn::Named<"attn_norm", Norm>(Norm(dev, c.width, s, id, c.seed, c.norm_eps)), {},
            nn::Named<"attn", Attn>(Attn(dev, c.width, c.heads, c.kv_heads, qk, c.rope, s, id + 1, c.seed, sd, sd)),
            {})),
        nn::Residual<MlpInner>(
            MlpInner(Mlp(nn::Named<"mlp_norm", Norm>(Norm(dev, c.width, s, id + 5, c.seed, c.norm_eps)),
                         nn::Named<"mlp", Experts>(Experts(dev, c.width, c.moe(), s, id + 6, c.seed, sd, sd))))));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          nn::ExpertDispatch Dispatcher = nn::AllToAllDispatch>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Dispatcher>>;

}  // namespace weft::qwen3_moe
