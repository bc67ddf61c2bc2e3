// Gpt<Precision, SequenceParallel, Recompute, Device>: a list of stages over flat state.
//
// Precision is a policy (core/precision.hpp: Precision<bf16, float>, or an element type standing
// for its own); Device is Host or Cuda, and every stage, layer and unit below is instantiated for it.
//
//   stage 0         EmbeddingStage: token and position embeddings          unit 0 "embedding"
//   stage 1 .. L    Block l                                                unit l + 1 "h<l-1>"
//   stage L + 1     HeadStage: final LayerNorm, the LM head tied to wte,   unit L + 1 "head"
//                   the vocab-parallel cross-entropy                       (and unit 0: the tied wte)
//
// Each stage has forward(ctx, ...) and backward(ctx, ...) over a context per micro-batch that the
// caller owns (Gpt::Ctx), and a forward that keeps nothing (Mode::infer). An executor
// (pipeline/executor.hpp) runs the stages in order and tells a data-parallel strategy which units
// each stage touches (units_of), so that FSDP can gather a unit just before its stage and DDP can
// reduce a unit's gradients as soon as its last backward is done. Each unit owns flat buffers for
// the parameters and gradients of its layers (unit.hpp).
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

// Which parts of the model a rank holds: a pipeline stage's blocks (any subset of the global block
// indices: interleaved schedules give a rank several chunks), and whether it holds the embedding
// stage and the head stage. Parameter ids, and so the weights, are those of the whole model.
struct Placement {
  std::vector<bool> blocks;  // blocks[l]: global block l is here
  bool embedding = true, head = true;
  static Placement all(std::int64_t layers) { return {std::vector<bool>(static_cast<std::size_t>(layers), true), true, true}; }
};

// One micro-batch: this data rank's tokens and targets (B/dp, T), owned by the caller.
struct MicroBatch {
  std::span<const std::int32_t> tokens, targets;
  std::int64_t batch = 0;   // B, the global micro-batch
  double grad_scale = 1.0;  // multiplies every gradient (1/k when accumulating k micro-batches)
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host>
class Gpt {
 public:
  using precision = precision_t<P>;
  using T = typename precision::compute;  // weights and activations
  using A = typename stream<SP>::layout;
  using value_type = T;
  using device = D;
  using Unit = nn::Unit<T, D>;
  using BlockT = Block<T, SP, Recompute, D>;
  using Embedding = EmbeddingStage<T, SP, D>;
  using Head = HeadStage<T, SP, D>;

  // Everything one micro-batch in flight keeps between its stages.
  struct Ctx {
    MicroBatch in;  // tokens and targets in the device's memory (copied there by context())
    Allocation ids;  // the device's copy of the tokens, then the targets (devices without host memory)
    typename Embedding::Ctx embedding;
    std::vector<typename BlockT::Ctx> blocks;
    typename Head::Ctx head;
    Tensor<T, A, D> x;  // (B, T, C) in A: the activation between stages, then its gradient
    double loss = 0;    // the mean over the global batch, after the head's forward
  };

  GptConfig config;
  Embedding embedding;         // held where placement.embedding
  std::vector<BlockT> blocks;  // the blocks held here, in global order (all of them by default)
  Head head;                   // held where placement.head
  // Where the head is held without the embedding (a pipeline's last stage), its own copy of the
  // tied table: initialized as wte is, its gradient summed with wte's over the pipeline's first and
  // last ranks before each step (tied_unit(), and the data-parallel protocol's reduce_tied()).
  typename Head::Table head_table;

  Gpt(D& dev, const GptConfig& c, const Spread& s, std::int64_t batch,
      const Placement& place = Placement{})
      : config((validate(c, s, SP, batch), c)), place_(place.blocks.empty() && place.embedding && place.head
                                                           ? Placement::all(c.layers)
                                                           : place), dev_(&dev) {
    if (static_cast<std::int64_t>(place_.blocks.size()) != c.layers)
      throw Error("Gpt", cat("a placement of ", place_.blocks.size(), " blocks for a model of ", c.layers),
                  "give the placement one entry per block");
    const std::int64_t vp = padded_vocab(c.vocab, s.tensor_degree);
    if (place_.embedding) embedding = Embedding(dev, vp, c.seq, c.width, s, c.seed, c.init_std);
    block_at_.assign(static_cast<std::size_t>(c.layers), -1);
    blocks.reserve(static_cast<std::size_t>(c.layers));
    for (std::int64_t l = 0; l < c.layers; ++l) {
      if (!place_.blocks[static_cast<std::size_t>(l)]) continue;
      block_at_[static_cast<std::size_t>(l)] = static_cast<int>(blocks.size());
      blocks.emplace_back(dev, c.width, c.heads, c.layers, s, static_cast<std::uint64_t>(16 + 16 * l), c.seed,
                          c.init_std);
    }
    if (place_.head) head = Head(dev, c.vocab, c.width, s, c.seed);
    const bool split_tie = place_.embedding != place_.head;  // the tied table lives on two ranks
    if (place_.head && !place_.embedding)
      head_table = typename Head::Table(dev, {vp, c.width}, s, 0, {Init::normal, c.init_std}, c.seed);  // wte's id: the same draws
    // The units record the Params' addresses: from here on the model stays where it is. With the
    // table on two ranks, it is a unit of its own on both ("wte"), so that its flat buffers, and
    // any data-parallel slices of them, line up between the two.
    stage_units_.assign(static_cast<std::size_t>(c.layers) + 2, {});
    units_.reserve(blocks.size() + 3);
    if (place_.embedding) {
      if (split_tie) {
        tied_ = units_.size();
        units_.emplace_back("wte", dev).add("wte", embedding.wte);
        stage_units_[0].push_back(units_.size());
        units_.emplace_back("embedding", dev).add("wpe", embedding.wpe);
        stage_units_[0].push_back(*tied_);
      } else {
        stage_units_[0].push_back(units_.size());
        units_.emplace_back("embedding", dev).add("", embedding);
      }
    }
    for (std::int64_t l = 0; l < c.layers; ++l)
      if (const int b = block_at_[static_cast<std::size_t>(l)]; b >= 0) {
        stage_units_[static_cast<std::size_t>(l) + 1].push_back(units_.size());
        units_.emplace_back(cat("h", l), dev).add(cat("h", l), blocks[static_cast<std::size_t>(b)]);
      }
    if (place_.head) {
      auto& hs = stage_units_[static_cast<std::size_t>(c.layers) + 1];
      hs.push_back(units_.size());
      units_.emplace_back("head", dev).add("", head);
      if (split_tie) {
        tied_ = units_.size();
        tied_copy_ = true;
        units_.emplace_back("wte", dev).add_param("wte", head_table);
      }
      hs.push_back(tied_ ? *tied_ : 0);  // the head uses the tied table
    }
    data_degree_ = s.data_degree;
    for (Unit& u : units_) {
      u.set_logical("wte", {c.vocab, c.width});  // the rows past the vocabulary are padding
      u.build(s.data_degree);
    }
  }
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // Stages, and the units each one reads and writes. Stage 0 is the embedding, 1 .. L the blocks,
  // L + 1 the head; a rank runs only the stages it holds (holds()).
  std::size_t stages() const { return static_cast<std::size_t>(config.layers) + 2; }
  bool holds(std::size_t stage) const {
    if (stage == 0) return place_.embedding;
    if (stage + 1 == stages()) return place_.head;
    return block_at_[stage - 1] >= 0;
  }
  std::span<Unit> units() { return units_; }
  std::vector<std::size_t> units_of(std::size_t stage) const { return stage_units_[stage]; }
  // The unit that holds the tied table where it is held on two ranks, and whether this rank's is
  // the head's copy (counted once in the gradient norm: on the embedding's rank).
  std::optional<std::size_t> tied_unit() const { return tied_; }
  bool tied_copy() const { return tied_copy_; }
  D& dev() const { return *dev_; }
  const Placement& placement() const { return place_; }
  // The configuration's record (checkpoints save it and compare it on load).
  std::vector<std::pair<std::string, std::int64_t>> record() const { return nn::record(config); }

  // Zero-bubble schedules: defer the blocks' Linear weight gradients to backward_weight().
  void defer_weight(bool on) {
    for (BlockT& b : blocks) b.defer_weight(on);
  }
  void backward_weight(std::size_t stage, Ctx& ctx) {
    if (stage >= 1 && stage + 1 < stages()) block(stage - 1).backward_weight(ctx.blocks[stage - 1]);
  }

  // A context for one micro-batch (tokens and targets in host memory); checks the tokens first and
  // copies them to the device where it has its own memory.
  Ctx context(const MicroBatch& in) const {
    check_tokens(in);
    Ctx ctx;
    ctx.in = in;
    if constexpr (!D::host_memory) {
      D& dev = *dev_;
      const std::size_t n = in.tokens.size();
      ctx.ids = dev.allocate(static_cast<std::int64_t>(2 * n * sizeof(std::int32_t)), Category::activations);
      auto* ids = static_cast<std::int32_t*>(ctx.ids.data());
      dev.from_host(ids, in.tokens.data(), n * sizeof(std::int32_t));
      dev.from_host(ids + n, in.targets.data(), n * sizeof(std::int32_t));
      ctx.in.tokens = {ids, n};
      ctx.in.targets = {ids + n, n};
    }
    ctx.blocks.resize(static_cast<std::size_t>(config.layers));
    return ctx;
  }

  template <AxisComms M>
  void forward(std::size_t stage, Ctx& ctx, M& mesh, Mode mode = Mode::train) {
    if (stage == 0) {
      ctx.x = embedding.forward(ctx.embedding, ctx.in.tokens, ctx.in.batch, config.seq, mesh);
    } else if (stage + 1 < stages()) {
      BlockT& b = block(stage - 1);
      ctx.x = mode == Mode::train ? b.forward(ctx.blocks[stage - 1], ctx.x, mesh) : b.infer(ctx.x, mesh);
    } else {
      ctx.loss = head.forward(ctx.head, ctx.x, table(), ctx.in.targets, mesh, mode);
      ctx.x = {};
    }
  }

  template <AxisComms M>
  void backward(std::size_t stage, Ctx& ctx, M& mesh) {
    if (stage + 1 == stages()) {
      ctx.x = head.backward(ctx.head, table(), ctx.in.grad_scale, mesh);
    } else if (stage > 0) {
      ctx.x = block(stage - 1).backward(ctx.blocks[stage - 1], ctx.x, mesh);
    } else {
      embedding.backward(ctx.embedding, ctx.x, mesh);
      ctx.x = {};
    }
  }

  // The plan for config c, a global batch and degrees s, from the types alone: every stage's rows in
  // stage order, then what the data-parallel step adds on the tensor axis.
  static std::vector<PlanRow> plan_rows(const GptConfig& c, std::int64_t batch, const Spread& s) {
    validate(c, s, SP, batch);
    const std::int64_t e = sizeof(T), eg = sizeof(master_t<T>), C = c.width;
    const Shape act{batch, c.seq, C};
    std::vector<PlanRow> out;
    Embedding::plan_rows(out, act, s, e);
    for (std::int64_t l = 0; l < c.layers; ++l) BlockT::plan_rows(out, cat("h", l), act, s, e);
    Head::plan_rows(out, c.vocab, padded_vocab(c.vocab, s.tensor_degree), act, s, e);
    // Under SP the LayerNorm and position gradients are Partial on tensor: one all-reduce per step
    // for all of them (4 C per block, 2 C for ln_f, T C for wpe).
    if (SP)
      out.push_back({"gradients Partial on tensor (SP), per step", "-", "-", {}, {},
                     {detail::reduction(Axis::tensor, s.tensor_degree, (4 * c.layers * C + 2 * C + c.seq * C) * eg)}});
    return out;
  }

  // f(name, param) for every parameter, in a fixed order (the same for every strategy).
  // (Parameters of the parts this rank holds; the head's copy of the tied table is not listed.)
  template <class F>
  void for_each_param(F&& f) {
    if (place_.embedding) embedding.for_each_param("", f);
    for (std::int64_t l = 0; l < config.layers; ++l)
      if (const int b = block_at_[static_cast<std::size_t>(l)]; b >= 0) blocks[static_cast<std::size_t>(b)].for_each_param(cat("h", l), f);
    if (place_.head) head.for_each_param("", f);
  }

  void zero_grad() {
    for (Unit& u : units_) u.zero_grad();
  }

 private:
  BlockT& block(std::size_t l) {
    const int b = block_at_[l];
    if (b < 0) throw Error("Gpt", cat("block ", l, " is not held by this rank"), "run only the stages this rank holds");
    return blocks[static_cast<std::size_t>(b)];
  }
  typename Head::Table& table() { return place_.embedding ? embedding.wte.weight : head_table; }

  void check_tokens(const MicroBatch& in) const {
    const std::int64_t N = in.batch / data_degree_ * config.seq;
    if (static_cast<std::int64_t>(in.tokens.size()) != N || static_cast<std::int64_t>(in.targets.size()) != N)
      throw Error("Gpt::context",
                  cat(in.tokens.size(), " tokens and ", in.targets.size(), " targets for a local batch of ", N, " positions"),
                  "pass (batch / data degree) x seq tokens and targets");
    for (std::int64_t i = 0; i < N; ++i) {
      const auto t = in.tokens[static_cast<std::size_t>(i)], y = in.targets[static_cast<std::size_t>(i)];
      if (t < 0 || t >= config.vocab || y < 0 || y >= config.vocab)
        throw Error("Gpt::context",
                    cat("token ", t, " or target ", y, " at position ", i, " is outside the vocabulary of ", config.vocab),
                    "pass ids in [0, vocab)");
    }
  }

  Placement place_;
  D* dev_;
  std::vector<int> block_at_;                          // global block -> index in blocks, or -1
  std::vector<std::vector<std::size_t>> stage_units_;  // per stage: the units it uses
  std::optional<std::size_t> tied_;
  bool tied_copy_ = false;
  int data_degree_ = 1;
  std::vector<Unit> units_;
};

}  // namespace weft::nn
