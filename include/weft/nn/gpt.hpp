// Gpt<Precision, SequenceParallel, Recompute, Device>: GPT-2 as an instance of nn::StagedModel
// (staged_model.hpp), a list of stages over flat state.
//
// Precision is a policy (core/precision.hpp: Precision<bf16, float>, or an element type standing
// for its own); Device is Host or Cuda, and every stage, layer and unit below is instantiated for it.
//
//   stage 0         EmbeddingStage: token and position embeddings          unit 0 "embedding"
//   stage 1 .. L    Block l                                                unit l + 1 "h<l-1>"
//   stage L + 1     HeadStage: final LayerNorm, the LM head tied to wte,   unit L + 1 "head"
//                   the vocab-parallel cross-entropy                       (and unit 0: the tied wte)
//
// The LM head reads wte (EmbeddingStage::tied_table, HeadStage::Table: a tie declared by the two
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

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/core/divisors.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/stages.hpp"
#include "weft/nn/unit.hpp"

namespace weft::nn {

struct GptConfig {
  std::int64_t vocab = 64;
  std::int64_t seq = 16;      // T, the sequence length (and the number of positions)
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t width = 32;    // C
  std::uint64_t seed = 1234;
  double init_std = 0.02;     // GPT-2: normal(0, 0.02); residual projections scaled by 1/sqrt(2 layers)
};

// The fields that shape a GPT's parameters, as a checkpoint records them and a load compares them
// (the seed and init_std choose the initial values only).
inline std::vector<std::pair<std::string, std::int64_t>> record(const GptConfig& c) {
  return {{"vocab", c.vocab}, {"seq", c.seq}, {"layers", c.layers}, {"heads", c.heads}, {"width", c.width}};
}

// Checks a configuration against the mesh's degrees before anything is allocated.
inline void validate(const GptConfig& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  if (c.vocab < 1 || c.seq < 1 || c.layers < 1 || c.heads < 1 || c.width < 1)
    throw Error("Gpt", cat("vocab ", c.vocab, ", seq ", c.seq, ", layers ", c.layers, ", heads ", c.heads, ", width ",
                           c.width, " include one below 1"),
                "use sizes >= 1");
  if (c.width % c.heads != 0)
    throw Error("Gpt", cat("width ", c.width, " is not divisible by ", c.heads, " heads"),
                cat("use a head count that divides the width, such as ", list_divisors(c.width, c.heads)));
  if (c.heads % s.tensor_degree != 0)
    throw Error("Gpt", cat("tensor degree ", s.tensor_degree, " does not divide ", c.heads, " heads"),
                cat("use a tensor degree that divides the heads, such as ", list_divisors(c.heads, s.tensor_degree)));
  if (sequence_parallel && c.seq % s.tensor_degree != 0)
    throw Error("Gpt", cat("sequence parallelism needs the tensor degree ", s.tensor_degree,
                           " to divide the sequence length ", c.seq),
                cat("use a tensor degree that divides the sequence length, such as ", list_divisors(c.seq, s.tensor_degree),
                    ", or a sequence length that it divides"));
  if (batch % s.data_degree != 0)
    throw Error("Gpt", cat("data degree ", s.data_degree, " does not divide the batch of ", batch),
                cat("use a batch that is a multiple of ", s.data_degree));
}

// The vocabulary padded to a multiple of the tensor degree.
constexpr std::int64_t padded_vocab(std::int64_t vocab, int tensor_degree) {
  return (vocab + tensor_degree - 1) / tensor_degree * tensor_degree;
}

// GPT-2's parts for nn::StagedModel (staged_model.hpp): the stage types, how each is built with GPT-2's
// parameter ids (the embedding 0 and 1, ln_f 8, block l from 16 + 16 l), the unit names ("h<l>"),
// the padded vocabulary's logical rows, and the plan's rows.
template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host>
struct GptSpec {
  using precision = precision_t<P>;
  using T = typename precision::compute;
  using config = GptConfig;
  using device = D;
  using A = typename stream<SP>::layout;
  using Embedding = EmbeddingStage<T, SP, D>;
  using Block = nn::Block<T, SP, Recompute, D>;
  using Head = HeadStage<T, SP, D>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "Gpt"; }
  static void validate(const GptConfig& c, const Spread& s, std::int64_t batch) { nn::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const GptConfig& c) { return nn::record(c); }
  static std::string block_name(std::int64_t l) { return cat("h", l); }

  static Embedding make_embedding(D& dev, const GptConfig& c, const Spread& s) {
    return Embedding(dev, padded_vocab(c.vocab, s.tensor_degree), c.seq, c.width, s, c.seed, c.init_std);
  }
  static Block make_block(D& dev, const GptConfig& c, const Spread& s, std::int64_t l) {
    return Block(dev, c.width, c.heads, c.layers, s, static_cast<std::uint64_t>(16 + 16 * l), c.seed, c.init_std);
  }
  static Head make_head(D& dev, const GptConfig& c, const Spread& s) { return Head(dev, c.vocab, c.width, s, c.seed); }
  // The head's copy of the tied table (a pipeline's last stage): wte's id, so the same draws.
  static typename Head::Table make_head_table(D& dev, const GptConfig& c, const Spread& s) {
    return typename Head::Table(dev, {padded_vocab(c.vocab, s.tensor_degree), c.width}, s, 0,
                                {Init::normal, c.init_std}, c.seed, Decay::no);
  }
  static void finish(Unit<T, D>& u, const GptConfig& c) {
    u.set_logical("wte", {c.vocab, c.width});  // the rows past the vocabulary are padding
  }

  // The plan from the types alone: every stage's rows in stage order, then what the data-parallel
  // step adds on the tensor axis.
  static std::vector<PlanRow> plan_rows(const GptConfig& c, std::int64_t batch, const Spread& s) {
    const std::int64_t e = sizeof(T), eg = sizeof(master_t<T>), C = c.width;
    const Shape act{batch, c.seq, C};
    std::vector<PlanRow> out;
    Embedding::plan_rows(out, act, s, e);
    for (std::int64_t l = 0; l < c.layers; ++l) Block::plan_rows(out, cat("h", l), act, s, e);
    Head::plan_rows(out, c.vocab, padded_vocab(c.vocab, s.tensor_degree), act, s, e);
    // Under SP the LayerNorm and position gradients are Partial on tensor: one all-reduce per step
    // for all of them (4 C per block, 2 C for ln_f, T C for wpe).
    if (SP)
      out.push_back({"gradients Partial on tensor (SP), per step", "-", "-", {}, {},
                     {detail::reduction(Axis::tensor, s.tensor_degree, (4 * c.layers * C + 2 * C + c.seq * C) * eg)}});
    return out;
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host>
using Gpt = StagedModel<GptSpec<P, SP, Recompute, D>>;

}  // namespace weft::nn
