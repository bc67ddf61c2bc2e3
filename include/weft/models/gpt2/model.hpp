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

#include <string>
#include <utility>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/models/gpt2/block.hpp"
#include "weft/models/gpt2/config.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/stages.hpp"
#include "weft/nn/unit.hpp"

namespace weft::gpt2 {

// GPT-2's parts for nn::StagedModel (staged_model.hpp): the stage types, how each is built with GPT-2's
// parameter ids (the embedding 0 and 1, ln_f 8, block l from 16 + 16 l), the unit names ("h<l>"),
// the padded vocabulary's logical rows, and the plan's rows.
//
// Context parallelism (Cx = context::Ring or context::AllGather; docs/context.md): the stream is a
// context rank's rows of the sequence (two chunks), its positions those rows' positions; the
// attention runs over the context group, every other layer on the rows. The model on the host only,
// so far (its stages take the rows' tokens in host memory).
template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;
  using precision = precision_t<P>;
  using T = typename precision::compute;
  using config = Config;
  using device = D;
  using A = typename nn::stream<SP, cp>::layout;
  using Embedding = nn::EmbeddingStage<T, SP, D, Cx>;
  using Block = gpt2::Block<T, SP, Recompute, D, Cx>;
  using Head = nn::TiedHeadStage<T, SP, D, nn::LayerNorm<T, typename nn::stream<SP>::layout, D>, Cx>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "Gpt"; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) { gpt2::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return gpt2::record(c); }
  static std::string block_name(std::int64_t l) { return cat("h", l); }

  static Embedding make_embedding(D& dev, const Config& c, const Spread& s) {
    return Embedding(dev, nn::padded_vocab(c.vocab, s.tensor_degree), c.seq, c.width, s, c.seed, c.init_std);
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    return Block(dev, c.width, c.heads, c.layers, s, static_cast<std::uint64_t>(16 + 16 * l), c.seed, c.init_std);
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

  // The plan from the types alone: every stage's rows in stage order, then what the data-parallel
  // step adds on the tensor axis.
  static std::vector<nn::PlanRow> plan_rows(const Config& c, std::int64_t batch, const Spread& s) {
    const std::int64_t e = sizeof(T), eg = sizeof(master_t<T>), C = c.width;
    const Shape act{batch, c.seq, C};
    std::vector<nn::PlanRow> out;
    Embedding::plan_rows(out, act, s, e);
    for (std::int64_t l = 0; l < c.layers; ++l) Block::plan_rows(out, cat("h", l), act, s, e, c.heads);
    Head::plan_rows(out, c.vocab, nn::padded_vocab(c.vocab, s.tensor_degree), act, s, e);
    // Under SP the LayerNorm and position gradients are Partial on tensor: one all-reduce per step
    // for all of them (4 C per block, 2 C for ln_f, T C for wpe).
    if (SP)
      out.push_back(
          {"gradients Partial on tensor (SP), per step",
           "-",
           "-",
           {},
           {},
           {nn::detail::reduction(Axis::tensor, s.tensor_degree, (4 * c.layers * C + 2 * C + c.seq * C) * eg)}});
    return out;
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Cx>>;

}  // namespace weft::gpt2
