// gpt2::Model<Precision, SequenceParallel, Recompute, Device>: GPT-2 as an instance of
// nn::StagedModel (nn/staged_model.hpp), a list of stages over flat state.
//
// Precision is a policy (core/precision.hpp: Precision<bf16, float>, or an element type standing
// for its own); Device is Host or Cuda, and every stage, layer and unit below is instantiated for it.
//
//   stage 0         EmbeddingStage: token and position embeddings          unit 0 "embedding"
//   stage 1 .. L    Block l                                                unit l + 1 "h<l-1>"
//   stage L + 1     TiedHeadStage: final LayerNorm, the LM head tied to wte,   unit L + 1 "head"
//                   the vocab-parallel cross-entropy                       (and unit 0: the tied wte)
//
// The LM head reads wte (EmbeddingStage::tied_table, TiedHeadStage::Table: a tie declared by the two
// stages); StagedModel keeps a copy of it on a pipeline's last rank and sums the two gradients.
//
//   tokens  (B, T) int32                          batch split over data
//   wte     (Vp, C)     Shard<0> on tensor        Vp = vocab padded to a multiple of the tensor degree
//   wpe     (T, C)      Replicate
//   x       (B, T, C)   the residual stream: Replicate, or Shard<1> with sequence parallelism
//   logits  (B, T, Vp/tp) Shard<-1>               never gathered: the loss needs two small
//                                                 all-reduces (row max; sum of exp with the target
//                                                 logit packed beside it)
//
// Padding rows of wte (vocab ids >= V) are never looked up and are masked out of the softmax, so
// they get no gradient and change no result. The loss is the mean over every token of the global
// batch.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/models/gpt2/config.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/layernorm.hpp"
#include "weft/nn/mlp.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/stages.hpp"
#include "weft/nn/stream.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/nn/unit.hpp"
#include "weft/recompute/checkpointed.hpp"

namespace weft::gpt2 {

// GPT-2's parts for nn::StagedModel (staged_model.hpp): the stage types, how each is built with GPT-2's
// parameter ids (the embedding 0 and 1, ln_f 8, block l from 16 + 16 l: ln1 +0, ln2 +2, qkv +4,
// attn proj +6, fc +8, mlp proj +10), the unit names ("h<l>") and the padded vocabulary's logical
// rows. describe's rows come from walking the layers (nn/comm_walk.hpp), as for any model.
//
// A block, as Llama's: x = x + attn(ln1(x)); x = x + mlp(ln2(x)), each branch a Residual over a
// Sequential that checks every boundary's layouts at compile time (ln -> Enter -> the Replicate-in,
// Partial-out layer -> Leave back to the stream). Around each branch (Megatron):
//   without SP: CopyToTensor before (backward all-reduce), ReduceFromTensor after (forward all-reduce)
//               -> 2 all-reduces forward, 2 backward per block
//   with SP:    GatherFromSequence before (all-gather; backward reduce-scatter), ScatterToSequence after
//               (reduce-scatter; backward all-gather) -> 2 all-gathers and 2 reduce-scatters each way
// Under SP the LayerNorm parameter gradients are partial sums over each rank's sequence slice: their
// layout is Partial on the tensor axis, and the data-parallel step reduces them once per step with
// every other gradient.
//
// Context parallelism (Cx = context::Ring or context::AllGather; docs/context.md): the stream is a
// context rank's rows of the sequence (two chunks), its positions those rows' positions; the
// attention runs over the context group, every other layer on the rows (nn::TokenWise). The model on
// the host only, so far (its stages take the rows' tokens in host memory).
template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;
  using precision = precision_t<P>;
  using T = typename precision::compute;
  using config = Config;
  using device = D;
  using Local = nn::stream<SP>;                   // the layers' own layouts (on a context rank's rows under Cx)
  using A = typename nn::stream<SP, cp>::layout;  // the stream between stages and blocks
  using Norm = nn::LayerNorm<T, typename Local::layout, D>;
  using G = typename precision::gemms;  // the linear layers' GEMMs: in T, or on float8 casts
  using Attn = nn::GroupedQueryAttention<T, Recompute, D, Cx, mask::Causal,
                                         G>;  // multi-head: kv_heads = heads, biased, not rotated
  using Mlp = nn::Mlp<T, D, G>;               // fc (C -> 4C, GELU), proj (4C -> C)
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;
  using AttnInner = nn::Sequential<on_rows<nn::Named<"ln1", Norm>>, Enter, nn::Named<"attn", Attn>, Leave>;
  using MlpSeq =
      nn::Sequential<nn::Named<"ln2", Norm>, typename Local::enter, nn::Named<"mlp", Mlp>, typename Local::leave>;
  using MlpInner = on_rows<MlpSeq>;
  using Layer = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Embedding = nn::EmbeddingStage<T, SP, D, Cx>;
  using Block = recompute::apply_t<Recompute, Layer, T, D>;
  using Head = nn::TiedHeadStage<T, SP, D, Norm, Cx>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "GPT-2"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) { gpt2::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return gpt2::record(c); }
  static std::string block_name(std::int64_t l) { return cat("h", l); }

  static Embedding make_embedding(D& dev, const Config& c, const Spread& s) {
    return Embedding(dev, nn::padded_vocab(c.vocab, s.tensor_degree), c.seq, c.width, s, c.seed, c.init_std);
  }
  // The output projections' weights start at init_std / sqrt(2 layers) (GPT-2's scaled residual init).
  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double sd = c.init_std, proj = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
    return Layer(
        nn::Residual<AttnInner>(AttnInner(
            on_rows<nn::Named<"ln1", Norm>>(nn::Named<"ln1", Norm>(Norm(dev, c.width, s, id, c.seed))), {},
            nn::Named<"attn", Attn>(Attn::multi_head(dev, c.width, c.heads, s, id + 4, c.seed, sd, proj)), {})),
        nn::Residual<MlpInner>(
            MlpInner(MlpSeq(nn::Named<"ln2", Norm>(Norm(dev, c.width, s, id + 2, c.seed)), {},
                            nn::Named<"mlp", Mlp>(Mlp(dev, c.width, s, id + 8, c.seed, sd, proj)), {}))));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
  static Head make_head(D& dev, const Config& c, const Spread& s) { return Head(dev, c.vocab, c.width, s, c.seed); }
  // The head's copy of the tied table (a pipeline's last stage): wte's id, so the same draws.
  static typename Head::Table make_head_table(D& dev, const Config& c, const Spread& s) {
    return typename Head::Table(dev, {nn::padded_vocab(c.vocab, s.tensor_degree), c.width}, s, 0,
                                {nn::Init::normal, c.init_std}, c.seed, nn::Decay::no);
  }
  static void finish(nn::Unit<T, D>& u, const Config& c) {
    u.set_logical("wte", {c.vocab, c.width});  // the rows past the vocabulary are padding
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Cx>>;

}  // namespace weft::gpt2
