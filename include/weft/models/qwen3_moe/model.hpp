// qwen3_moe::Model<Precision, SequenceParallel, Recompute, Device, Dispatcher, ExpertTensor>: Qwen3-MoE
// (Qwen team 2025), Mixtral's blocks (models/mixtral/model.hpp, its ExpertTensor too) with Qwen3's
// attention, an instance of
// nn::StagedModel built from weft's generic layers:
//
//   stage 0         TokenEmbeddingStage: the vocab-parallel table                    "embedding"
//   stage 1 .. L    layers.l: x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))   "layers.<l>", and
//                   attn: GroupedQueryAttention with heads of head_dim (not C / H)    "layers.<l>.experts"
//                         and QK norm: each head's queries and keys RMS-normalised
//                         over head_dim before the rotation (q_norm, k_norm)
//                   mlp:  in a sparse layer, MoeMlp: softmax router over E experts, the
//                         top k weighted by their probabilities (renormalised to sum 1
//                         where norm_topk_prob), each expert a SwiGLU of width `hidden`;
//                         in a dense layer (Config::sparse(l) false), Llama's MLP of
//                         width dense_hidden: gate_up (ColumnParallel), SwiGlu, down
//                         (RowParallel). nn::Either holds the one the layer has.
//   stage L + 1     norm (RmsNorm), the LM head, the vocab-parallel cross-entropy    "head"
//
//   tokens  (B, T) int32                      batch split over data
//   x       (B, T, C)  the residual stream: Replicate, or Shard<1> with sequence parallelism
//   qkv     (B, T, KV (g + 2) hd / tp)        hd = head_dim; the core (B, T, H hd / tp)
//   experts (E, ...)   ExpertSharded: E / ep a rank of the expert group (carved from data x context)
//   gate_up (2 Fd, C)  a dense layer's, Shard<0> on tensor by (gate, up) pairs; down (C, Fd) Shard<1>
//
// A layer is sparse as transformers' Qwen3MoeDecoderLayer decides: not among mlp_only_layers, and
// (l + 1) a multiple of decoder_sparse_step. The loss a step's gradients follow: the cross-entropy
// plus each sparse layer's aux_coef times its load-balancing loss and z_coef times its z-loss, as
// Mixtral's. Parameter ids: Mixtral's, the attention's q_norm +11 and k_norm +12 of block l's
// 16 + 16 l, and a dense layer's gate_up +6 and down +8 (Llama's). Not yet: context parallelism (QK
// norm is not on its path).
//
// defines: qwen3_moe::Config, qwen3_moe::record, qwen3_moe::validate, qwen3_moe::Spec, qwen3_moe::Model
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "weft/models/mixtral/model.hpp"
#include "weft/nn/either.hpp"

namespace weft::qwen3_moe {

// Mixtral's sizes (hidden: each expert's width, transformers' moe_intermediate_size) with the head
// size of their own, the router's renormalisation a choice, and the layers that are dense.
struct Config : mixtral::Config {
  std::int64_t head_size = 0;  // head_dim; 0: width / heads
  bool norm_topk_prob = false;
  std::int64_t sparse_step = 1;               // decoder_sparse_step: experts in layers l with (l + 1) % it == 0
  std::vector<std::int64_t> mlp_only_layers;  // dense whatever the step (transformers' mlp_only_layers)
  std::int64_t dense_hidden = 0;              // intermediate_size: a dense layer's MLP width (0: hidden)

  std::int64_t head_dim() const { return head_size > 0 ? head_size : width / heads; }
  std::int64_t dense_width() const { return dense_hidden > 0 ? dense_hidden : hidden; }
  // Whether layer l has experts (transformers' Qwen3MoeDecoderLayer: not in mlp_only_layers, and
  // (l + 1) a multiple of decoder_sparse_step).
  bool sparse(std::int64_t l) const {
    return std::ranges::find(mlp_only_layers, l) == mlp_only_layers.end() && sparse_step >= 1 &&
           (l + 1) % sparse_step == 0;
  }
  // The dense layers, in order.
  std::vector<std::int64_t> dense_layers() const {
    std::vector<std::int64_t> d;
    for (std::int64_t l = 0; l < layers; ++l)
      if (!sparse(l)) d.push_back(l);
    return d;
  }
  nn::MoeOptions moe() const {
    nn::MoeOptions o = mixtral::Config::moe();
    o.renormalise = norm_topk_prob;
    return o;
  }
};

// Past Mixtral's: the head size, the renormalisation and, where a layer is dense (earlier
// checkpoints' records hold none: experts in every layer), their count, each one's index and their
// MLP width (the layers themselves, however config.json chose them).
inline std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
  auto r = mixtral::record(c);
  r.emplace_back("head_dim", c.head_dim());
  r.emplace_back("norm_topk_prob", c.norm_topk_prob ? 1 : 0);
  const auto dense = c.dense_layers();
  if (!dense.empty()) {
    r.emplace_back("dense_layers", static_cast<std::int64_t>(dense.size()));
    for (std::size_t i = 0; i < dense.size(); ++i) r.emplace_back(cat("dense_layer_", i), dense[i]);
    r.emplace_back("dense_hidden", c.dense_width());
  }
  return r;
}

inline void validate(const Config& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  mixtral::validate(c, s, sequence_parallel, batch);
  if (c.head_size < 0 || c.head_dim() % 2 != 0)
    throw Error("Qwen3-MoE", cat("a head size of ", c.head_dim()), "use an even head_dim (or 0: width / heads)");
  if (c.sparse_step < 1)
    throw Error("Qwen3-MoE", cat("a decoder sparse step of ", c.sparse_step),
                "use 1 (experts in every layer) or more (experts in every step-th layer)");
  for (const std::int64_t l : c.mlp_only_layers)
    if (l < 0 || l >= c.layers)
      throw Error("Qwen3-MoE", cat("mlp_only_layers names layer ", l, " of ", c.layers),
                  cat("name dense layers from 0 to ", c.layers - 1));
  if (!c.dense_layers().empty() &&
      (c.dense_hidden < 0 || c.dense_width() < 1 || c.dense_width() % s.tensor_degree != 0))
    throw Error("Qwen3-MoE",
                cat("dense layers of MLP width ", c.dense_width(), " (intermediate_size) over a tensor degree of ",
                    s.tensor_degree),
                "use a dense width that is a multiple of the tensor degree");
}

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          nn::ExpertDispatch Dispatcher = nn::AllToAllDispatch, nn::ExpertTensor ET = nn::ExpertTensor::whole>
struct Spec : mixtral::Spec<P, SP, Recompute, D, Dispatcher, context::None, ET> {
  using Base = mixtral::Spec<P, SP, Recompute, D, Dispatcher, context::None, ET>;
  using typename Base::Attn;
  using typename Base::AttnInner;
  using typename Base::Experts;
  using typename Base::Local;
  using typename Base::Norm;
  using typename Base::T;
  using config = Config;
  // A sparse layer's MLP branch (Mixtral's), and a dense layer's (Llama's, its projections under "mlp").
  using Sparse = typename Base::Mlp;
  using DenseMlp = nn::Sequential<nn::Named<"gate_up", typename Base::GateUp>, nn::SwiGlu<T, D>,
                                  nn::Named<"down", typename Base::Down>>;
  using Dense = nn::Sequential<nn::Named<"mlp_norm", Norm>, typename Local::enter, nn::Named<"mlp", DenseMlp>,
                               typename Local::leave>;
  using Mlp = nn::Either<Sparse, Dense>;
  using MlpInner = Mlp;
  using Layer = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Block = recompute::apply_t<Recompute, Layer, T, D>;

  static std::string name() { return "Qwen3-MoE"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) { qwen3_moe::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return qwen3_moe::record(c); }

  static Mlp make_mlp(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std;
    if (c.sparse(l)) return Mlp(Base::make_mlp(dev, c, s, l));
    auto norm = nn::Named<"mlp_norm", Norm>(Norm(dev, c.width, s, id + 5, c.seed, c.norm_eps));
    const std::int64_t F = c.dense_width();
    using GateUp = typename Base::GateUp;
    using Down = typename Base::Down;
    return Mlp(Dense(std::move(norm), {},
                     nn::Named<"mlp", DenseMlp>(DenseMlp(
                         nn::Named<"gate_up", GateUp>(GateUp(dev, c.width, 2 * F, s, id + 6, c.seed, sd, false)), {},
                         nn::Named<"down", Down>(Down(dev, F, c.width, s, id + 8, c.seed, sd, false)))),
                     {}));
  }
  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std;
    const nn::QkNorm qk{.head_dim = c.head_dim(), .eps = c.norm_eps};
    return Layer(
        nn::Residual<AttnInner>(AttnInner(
            nn::Named<"attn_norm", Norm>(Norm(dev, c.width, s, id, c.seed, c.norm_eps)), {},
            nn::Named<"attn", Attn>(Attn(dev, c.width, c.heads, c.kv_heads, qk, c.rope, s, id + 1, c.seed, sd, sd)),
            {})),
        nn::Residual<MlpInner>(make_mlp(dev, c, s, l)));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          nn::ExpertDispatch Dispatcher = nn::AllToAllDispatch, nn::ExpertTensor ET = nn::ExpertTensor::whole>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Dispatcher, ET>>;

}  // namespace weft::qwen3_moe
