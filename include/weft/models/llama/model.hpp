// llama::Model<Precision, SequenceParallel, Recompute, Device, Tied>: the Llama family (Llama 2 and 3)
// as an instance of nn::StagedModel (nn/staged_model.hpp), built from weft's generic layers:
//
//   stage 0         TokenEmbeddingStage: the vocab-parallel table, no positions      "embedding"
//   stage 1 .. L    layers.l: x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))   "layers.<l>"
//                   attn: GroupedQueryAttention (rotary, kv_heads <= heads, no bias)
//                   mlp:  gate_up (ColumnParallel C -> 2F, (F, 2) pairs), SwiGlu, down (RowParallel F -> C)
//   stage L + 1     norm (RmsNorm), the LM head (its own table, or wte where Tied),   "head"
//                   the vocab-parallel cross-entropy
//
//   tokens  (B, T) int32                        batch split over data
//   wte     (Vp, C)      Shard<0> on tensor     Vp = vocab padded to a multiple of the tensor degree
//   x       (B, T, C)    the residual stream: Replicate, or Shard<1> with sequence parallelism
//   qkv     (B, T, KV (H/KV + 2) hd / tp)       whole key-value groups per tensor rank
//   logits  (B, T, Vp/tp) Shard<-1>             never gathered
//
// Tensor parallelism shards the heads by key-value group (the tensor degree divides kv_heads) and
// the MLP by pairs of hidden features; every schedule, strategy, recompute policy and checkpoint
// layout applies as to any StagedModel.
//
// Context parallelism (Cx = context::Ring or context::AllGather; docs/context.md): the stream is
// sharded over the sequence on the context axis, each rank holding its T / c rows (two chunks);
// the attention runs over the context group, Cx's way, every other layer of a block on the rank's
// rows (nn::TokenWise), the embedding and the loss on the rows' tokens and targets. The model on
// the host only, so far (its stages take the rows' tokens in host memory; the attention layers
// compile for the Cuda device too); tests/context/ holds the block and the model to one rank.
// Parameter ids: wte 0, the head's table 2 and norm 8, block l
// from 16 + 16 l (attn_norm +0, qkv +1, proj +3, mlp_norm +5, gate_up +6, down +8).
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "weft/context/attention.hpp"
#include "weft/core/precision.hpp"
#include "weft/models/llama/config.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/rmsnorm.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/stages.hpp"
#include "weft/nn/swiglu.hpp"
#include "weft/nn/token_embedding.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/recompute/checkpointed.hpp"

namespace weft::llama {

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          bool Tied = false, context::Choice Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;  // the sequence sharded over the context axis
  using precision = precision_t<P>;
  using T = typename precision::compute;
  using config = Config;
  using device = D;
  using Local = nn::stream<SP>;                   // the layers' own layouts (on a context rank's rows under Cx)
  using A = typename nn::stream<SP, cp>::layout;  // the stream between stages and blocks
  using Norm = nn::RmsNorm<T, typename Local::layout, D>;
  using G = typename precision::gemms;  // the linear layers' GEMMs: in T, or on float8 casts
  using Attn = nn::GroupedQueryAttention<T, Recompute, D, Cx, mask::Causal, G>;
  using GateUp = nn::Linear<T, nn::ColumnParallel, nn::epilogue::None, D, G>;
  using Down = nn::Linear<T, nn::RowParallel, nn::epilogue::None, D, G>;
  // Around the attention, the tensor-axis pairs, on the rank's rows under context parallelism; the
  // token-wise layers on those rows (nn::TokenWise).
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;
  using AttnInner = nn::Sequential<on_rows<nn::Named<"attn_norm", Norm>>, Enter, nn::Named<"attn", Attn>, Leave>;
  using Mlp = nn::Sequential<nn::Named<"mlp_norm", Norm>, typename Local::enter, nn::Named<"gate_up", GateUp>,
                             nn::SwiGlu<T, D>, nn::Named<"down", Down>, typename Local::leave>;
  using MlpInner = on_rows<Mlp>;
  using Layer = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Embedding = nn::TokenEmbeddingStage<T, SP, D, Cx>;
  using Block = recompute::apply_t<Recompute, Layer, T, D>;
  using Head = std::conditional_t<Tied, nn::TiedHeadStage<T, SP, D, Norm, Cx>, nn::HeadStage<T, SP, D, Norm, Cx>>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "Llama"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) {
    llama::validate(c, s, SP, batch);
    if (c.tied != Tied)
      throw Error("Llama",
                  cat("a configuration with tied ", c.tied ? "true" : "false", " for a model type with Tied ",
                      Tied ? "true" : "false"),
                  "build llama::Model<..., Tied = config.tied>");
  }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return llama::record(c); }
  static std::string block_name(std::int64_t l) { return cat("layers.", l); }

  static Embedding make_embedding(D& dev, const Config& c, const Spread& s) {
    return Embedding(dev, nn::padded_vocab(c.vocab, s.tensor_degree), c.width, s, c.seed, c.init_std);
  }
  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std;
    return Layer(
        nn::Residual<AttnInner>(AttnInner(
            on_rows<nn::Named<"attn_norm", Norm>>(
                nn::Named<"attn_norm", Norm>(Norm(dev, c.width, s, id, c.seed, c.norm_eps))),
            {}, nn::Named<"attn", Attn>(Attn(dev, c.width, c.heads, c.kv_heads, c.rope, s, id + 1, c.seed, sd, sd)),
            {})),
        nn::Residual<MlpInner>(MlpInner(
            Mlp(nn::Named<"mlp_norm", Norm>(Norm(dev, c.width, s, id + 5, c.seed, c.norm_eps)), {},
                nn::Named<"gate_up", GateUp>(GateUp(dev, c.width, 2 * c.hidden, s, id + 6, c.seed, sd, false)), {},
                nn::Named<"down", Down>(Down(dev, c.hidden, c.width, s, id + 8, c.seed, sd, false)), {}))));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
  static Head make_head(D& dev, const Config& c, const Spread& s) {
    Head h = [&] {
      if constexpr (Tied) return Head(dev, c.vocab, c.width, s, c.seed, 8);
      else return Head(dev, c.vocab, nn::padded_vocab(c.vocab, s.tensor_degree), c.width, s, c.seed, 8, 2, c.init_std);
    }();
    norm_of(h).eps = static_cast<typename Norm::S>(c.norm_eps);
    return h;
  }
  // A tied head's copy of the table (a pipeline's last stage): wte's id, so the same draws.
  static auto make_head_table(D& dev, const Config& c, const Spread& s)
    requires Tied
  {
    return typename Head::Table(dev, {nn::padded_vocab(c.vocab, s.tensor_degree), c.width}, s, 0,
                                {nn::Init::normal, c.init_std}, c.seed, nn::Decay::no);
  }
  static void finish(nn::Unit<T, D>& u, const Config& c) {  // the padded vocabulary's rows
    u.set_logical("wte", {c.vocab, c.width});
    if constexpr (!Tied) u.set_logical("lm_head", {c.vocab, c.width});
  }

 private:
  static Norm& norm_of(Head& h) {
    if constexpr (Tied) return h.ln_f;
    else return h.core.ln_f;
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          bool Tied = false, context::Choice Cx = context::None>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Tied, Cx>>;

}  // namespace weft::llama
