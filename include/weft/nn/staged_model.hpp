// StagedModel<Spec>: a model as a list of stages over flat state, built from the parts a Spec names.
// GPT-2 and Llama are instances (models/gpt2/model.hpp, models/llama/model.hpp); a user's model is
// another, with nothing of weft edited (examples/03_custom_model.hpp).
//
//   stage 0         Spec::Embedding: the batch's inputs -> the stream      unit "embedding"
//   stage 1 .. L    Spec::Block, one per layer                             unit Spec::block_name(l)
//                   (a block with experts: their expert-sharded weights in unit "<name>.experts")
//   stage L + 1     Spec::Head: the stream (and the batch) -> the loss     unit "head"
//
// Each stage has forward(ctx, ...) and backward(ctx, ...) over the state of one micro-batch
// in flight that the caller owns (Ctx, from in_flight()), and a forward that keeps nothing
// (Mode::infer: a block's infer(x, mesh), or its forward into a scratch Ctx where it has none, as a Sequential block).
// An executor (pipeline/executor.hpp) runs the stages in order and tells a data-parallel strategy which units each
// stage touches (units_of), so that FSDP can gather a unit just before its stage and DDP can reduce a unit's gradients
// as soon as its last backward is done. Each unit owns flat buffers for the parameters and gradients of its layers
// (unit.hpp).
//
//   in      Batch<Spec::Inputs> (nn/batch.hpp; nn::Tokens where the Spec names none: tokens and
//           targets (B, T) int32), each field split over data; read by the first stage and the head
//   x       (B, T, C)   the stream between stages, in Spec::A (Replicate, or Shard<1> under SP)
//
// A tied head (TiedHead: the head reads the embedding's table, as GPT-2's LM head reads wte) is
// declared by the parts: the head names the table's type and the embedding the parameter
// (tied_name(), tied_table()). Where a pipeline puts the two on different ranks, the head's rank
// holds its own copy of the table, initialized as the embedding's is, and the two copies are one
// unit of their own on both ranks (named as the parameter), so that their flat buffers and any
// data-parallel slices line up; the data-parallel protocol sums their gradients (reduce_tied()).
//
// The Spec (concept ModelSpec) supplies the types, the configuration (concept ModelConfig: seq,
// layers, width, seed), its inputs (Inputs, optional), and how to build each part; see
// models/gpt2/model.hpp for GPT-2's and docs/layers.md for writing one.
#pragma once

#include <concepts>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/redistribute.hpp"
#include "weft/core/error.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/batch.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/layer.hpp"
#include "weft/nn/padding.hpp"
#include "weft/nn/side.hpp"
#include "weft/nn/stage_mesh.hpp"
#include "weft/nn/unit.hpp"
#include "weft/ops/mask.hpp"

namespace weft::nn {

// Whether a stage's forward keeps what backward needs (train) or nothing (infer: evaluation,
// sampling).
enum class Mode : std::uint8_t { train, infer };

// Which parts of the model a rank holds: a pipeline stage's blocks (any subset of the global block
// indices: interleaved schedules give a rank several chunks), and whether it holds the embedding
// stage and the head stage. Parameter ids, and so the weights, are those of the whole model.
struct Parts {
  std::vector<bool> blocks;  // blocks[l]: global block l is here
  bool embedding = true, head = true;
  static Parts all(std::int64_t layers) {
    return {std::vector<bool>(static_cast<std::size_t>(layers), true), true, true};
  }
};

// What every part of weft reads from a model's configuration: the sequence length T (of the
// stream between stages), the number of blocks, the stream's width C, and the seed of the initial
// values. A model adds its own fields (a language model's vocab, heads, kv-heads, hidden width, ...).
template <class C>
concept ModelConfig = std::copyable<C> && requires(const C& c) {
  { c.seq } -> std::convertible_to<std::int64_t>;
  { c.layers } -> std::convertible_to<std::int64_t>;
  { c.width } -> std::convertible_to<std::int64_t>;
  { c.seed } -> std::convertible_to<std::uint64_t>;
};

// A head that reads the embedding's table (a tied LM head): it names the table's Param type.
template <class H>
concept TiedHead = requires { typename H::Table; };

// A model whose first stage produces a side input (nn/side.hpp) of side_width(config) values a
// sample: its Embedding's forward(ctx, in, side, mesh) writes it, its blocks and head read it
// through their mesh argument (nn::StageMesh), and its Embedding's backward(ctx, dx, dside, mesh)
// receives the gradient.
template <class S>
concept SidedSpec = requires(const typename S::config& c) {
  { S::side_width(c) } -> std::convertible_to<std::int64_t>;
};

// A model's parts. Spec::make_* build them for the whole model's parameter ids (the same on every
// mesh); validate() refuses a configuration before anything is allocated; record() lists the
// fields that shape the parameters (a checkpoint saves them and a load compares them).
template <class S>
concept ModelSpec = requires(typename S::device& dev, const typename S::config& c, const Spread& s, std::int64_t l) {
  typename S::precision;
  typename S::A;  // the stream's layout between stages
  requires ModelConfig<typename S::config>;
  requires Inputs<inputs_t<S>>;
  { S::sequence_parallel } -> std::convertible_to<bool>;
  { S::validate(c, s, l) };
  { S::record(c) } -> std::convertible_to<std::vector<std::pair<std::string, std::int64_t>>>;
  { S::make_embedding(dev, c, s) } -> std::same_as<typename S::Embedding>;
  { S::make_block(dev, c, s, l) } -> std::same_as<typename S::Block>;
  requires Layer<typename S::Block>;  // a block is a layer (layer.hpp), the stream's layout in and out
  { S::make_head(dev, c, s) } -> std::same_as<typename S::Head>;
  { S::block_name(l) } -> std::convertible_to<std::string>;
  { S::name() } -> std::convertible_to<std::string>;  // where errors are said to come from ("GPT-2")
};

namespace detail {
struct NoTable {};
template <class H, bool Tied> struct head_table {
  using type = NoTable;
};
template <class H> struct head_table<H, true> {
  using type = typename H::Table;
};
}  // namespace detail

template <ModelSpec Spec>
class StagedModel {
 public:
  using spec = Spec;
  using config_type = typename Spec::config;
  using precision = typename Spec::precision;
  using T = typename precision::compute;  // weights and activations
  using A = typename Spec::A;
  using value_type = T;
  using device = typename Spec::device;
  using D = device;
  using Unit = nn::Unit<T, D>;
  using BlockT = typename Spec::Block;
  using Embedding = typename Spec::Embedding;
  using Head = typename Spec::Head;
  static constexpr bool sequence_parallel = Spec::sequence_parallel;
  static constexpr bool tied = TiedHead<Head>;
  using Inputs = inputs_t<Spec>;
  using MicroBatch = Batch<Inputs>;
  static constexpr bool sided = SidedSpec<Spec>;
  static constexpr bool padded = PaddedInputs<Inputs>;  // samples shorter than seq (nn/padding.hpp)
  using Side = SideInput<T, D>;

  // The first stage and the head meet the stream in the model's layout: a head over another layout
  // (built without the model's context choice or sequence parallelism) cannot reduce its loss over
  // the rows this layout splits across ranks.
  static_assert(
      !requires { typename Head::A; } || std::same_as<typename Head::A, A>,
      "nn::StagedModel: the head (Spec::Head) takes the stream in another layout than the model's "
      "(Spec::A), so its loss cannot be reduced over the rows the model's layout splits (context "
      "parallelism splits the sequence over context ranks, sequence parallelism its rows over tensor "
      "ranks); build the head over the model's sequence parallelism and context choice, as "
      "nn::MseHeadStage<T, SP, Field, D, Norm, Cx>");
  static_assert(
      !requires { typename Embedding::A; } || std::same_as<typename Embedding::A, A>,
      "nn::StagedModel: the first stage (Spec::Embedding) makes the stream in another layout than the "
      "model's (Spec::A); build it over the model's sequence parallelism and context choice");

  // Everything one micro-batch in flight keeps between its stages.
  struct Ctx {
    MicroBatch in;                      // the inputs in the device's memory (copied there by in_flight())
    std::vector<Allocation> fields;     // the device's copies of the fields (devices without host memory)
    std::vector<std::int32_t> lengths;  // a padded model's (B/dp) lengths, in host memory
    typename Embedding::Ctx embedding;
    std::vector<typename BlockT::Ctx> blocks;
    typename Head::Ctx head;
    Tensor<T, A, D> x;  // (B, T, C) in A: the activation between stages, then its gradient
    Side side;          // a sided model's side input (B, K) and its gradient (nn/side.hpp)
    double loss = 0;    // the mean over the global batch, after the head's forward
  };

  using HeadTable = typename detail::head_table<Head, tied>::type;

  config_type config;
  Embedding embedding;         // held where placement.embedding
  std::vector<BlockT> blocks;  // the blocks held here, in global order (all of them by default)
  Head head;                   // held where placement.head
  HeadTable head_table;        // a tied head's own copy of the table, where the embedding is elsewhere

  StagedModel(D& dev, const config_type& c, const Spread& s, std::int64_t batch, const Parts& place = Parts{})
      : config((Spec::validate(c, s, batch), c)),
        place_(place.blocks.empty() && place.embedding && place.head ? Parts::all(c.layers) : place),
        dev_(&dev),
        spread_(s) {
    if (static_cast<std::int64_t>(place_.blocks.size()) != c.layers)
      throw Error(Spec::name(), cat("a placement of ", place_.blocks.size(), " blocks for a model of ", c.layers),
                  "give the placement one entry per block");
    if (place_.embedding) embedding = Spec::make_embedding(dev, c, s);
    block_at_.assign(static_cast<std::size_t>(c.layers), -1);
    blocks.reserve(static_cast<std::size_t>(c.layers));
    for (std::int64_t l = 0; l < c.layers; ++l) {
      if (!place_.blocks[static_cast<std::size_t>(l)]) continue;
      block_at_[static_cast<std::size_t>(l)] = static_cast<int>(blocks.size());
      blocks.push_back(Spec::make_block(dev, c, s, l));
    }
    if (place_.head) head = Spec::make_head(dev, c, s);
    const bool split_tie = tied && place_.embedding != place_.head;  // the tied table lives on two ranks
    if constexpr (tied)
      if (place_.head && !place_.embedding) head_table = Spec::make_head_table(dev, c, s);  // the same draws
    // The units record the Params' addresses: from here on the model stays where it is.
    stage_units_.assign(static_cast<std::size_t>(c.layers) + 2, {});
    units_.reserve(2 * blocks.size() + 3);
    if (place_.embedding) {
      if (split_tie) {
        tied_ = units_.size();
        units_.emplace_back(tied_name(), dev);
        units_.emplace_back("embedding", dev);
        Unit& table = units_[*tied_];
        Unit& rest = units_.back();
        embedding.for_each_param("", [&](const std::string& n, auto& p) {
          if (n == tied_name()) table.add_param(n, p);
          else rest.add_param(n, p);
        });
        stage_units_[0].push_back(*tied_ + 1);
        stage_units_[0].push_back(*tied_);
      } else {
        stage_units_[0].push_back(units_.size());
        units_.emplace_back("embedding", dev).add("", embedding);
      }
    }
    for (std::int64_t l = 0; l < c.layers; ++l)
      if (const int b = block_at_[static_cast<std::size_t>(l)]; b >= 0) {
        auto& block = blocks[static_cast<std::size_t>(b)];
        const std::string name = Spec::block_name(l);
        stage_units_[static_cast<std::size_t>(l) + 1].push_back(units_.size());
        units_.emplace_back(name, dev).add_part(name, block, false);
        if (Unit::has_experts(block)) {  // a mixture of experts' expert weights: a unit of their own
          stage_units_[static_cast<std::size_t>(l) + 1].push_back(units_.size());
          units_.emplace_back(name + ".experts", dev).add_part(name, block, true);
        }
      }
    if (place_.head) {
      auto& hs = stage_units_[static_cast<std::size_t>(c.layers) + 1];
      hs.push_back(units_.size());
      units_.emplace_back("head", dev).add("", head);
      if constexpr (tied) {
        if (split_tie) {
          tied_ = units_.size();
          tied_copy_ = true;
          units_.emplace_back(tied_name(), dev).add_param(tied_name(), head_table);
        }
        hs.push_back(tied_ ? *tied_ : 0);  // the head uses the tied table
      }
    }
    data_degree_ = s.data_degree;
    for (Unit& u : units_) {
      if constexpr (requires { Spec::finish(u, c); }) Spec::finish(u, c);  // logical shapes, decay overrides
      u.build(s.data_degree * s.context_degree);  // slices for the ranks that reduce gradients together
    }
  }
  StagedModel(const StagedModel&) = delete;
  StagedModel& operator=(const StagedModel&) = delete;

  // The name of a tied head's table ("wte").
  static std::string tied_name() {
    if constexpr (tied) return Embedding::tied_name();
    else return {};
  }

  // Stages, and the units each one reads and writes. Stage 0 is the embedding, 1 .. L the blocks,
  // L + 1 the head; a rank runs only the stages it holds (holds()).
  std::size_t stages() const { return static_cast<std::size_t>(config.layers) + 2; }
  std::int64_t layers() const { return config.layers; }
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
  const Parts& placement() const { return place_; }
  // The configuration's record (checkpoints save it and compare it on load).
  std::vector<std::pair<std::string, std::int64_t>> record() const { return Spec::record(config); }
  // The global shape of the stream between stages for a micro-batch of `batch` sequences, and of a
  // sided model's side input.
  Shape stream_shape(std::int64_t batch) const { return {batch, config.seq, config.width}; }
  Shape side_shape(std::int64_t batch) const
    requires sided
  {
    return {batch, Spec::side_width(config)};
  }
  const Spread& spread() const { return spread_; }

  // Zero-bubble schedules: defer the blocks' weight gradients to backward_weight().
  void defer_weight(bool on) {
    for (BlockT& b : blocks) b.defer_weight(on);
  }
  void backward_weight(std::size_t stage, Ctx& ctx) {
    if (stage >= 1 && stage + 1 < stages()) block(stage - 1).backward_weight(ctx.blocks[stage - 1]);
  }

  // One micro-batch in flight (its fields in host memory): its Ctx, the state it keeps between its
  // stages (never the context axis: that is context/); checks the fields first (Inputs::check)
  // and copies them to the device where it has its own memory.
  Ctx in_flight(const MicroBatch& in) const {
    const std::string where = cat(Spec::name(), "::in_flight");
    if (in.batch < 1 || in.batch % data_degree_ != 0)
      throw Error(where, cat("a micro-batch of ", in.batch, " over a data degree of ", data_degree_),
                  "use a micro-batch that the data degree divides");
    in.check(config, in.batch / data_degree_, where);
    Ctx ctx;
    ctx.in = in;
    if constexpr (padded) {
      const std::span<const std::int32_t> lengths = in.lengths;
      check_field(lengths, in.batch / data_degree_, "lengths", where, "1");
      ops::check_lengths({true, lengths.data()}, static_cast<std::int64_t>(lengths.size()), config.seq, where);
      ctx.lengths.assign(lengths.begin(), lengths.end());
    }
    if constexpr (!D::host_memory) {
      D& dev = *dev_;
      ctx.in.for_each_field([&](const char*, auto& field) {
        using E = typename std::remove_cvref_t<decltype(field)>::element_type;
        const std::size_t bytes = field.size_bytes();
        ctx.fields.push_back(dev.allocate(static_cast<std::int64_t>(bytes), Category::activations));
        auto* copy = static_cast<std::remove_const_t<E>*>(ctx.fields.back().data());
        if (bytes > 0) dev.from_host(copy, field.data(), bytes);
        field = {copy, field.size()};
      });
    }
    ctx.blocks.resize(static_cast<std::size_t>(config.layers));
    return ctx;
  }

  template <AxisComms M>
  void forward(std::size_t stage, Ctx& ctx, M& mesh, Mode mode = Mode::train) {
    if (stage == 0) {
      if constexpr (sided) {
        ctx.side.value =
            Tensor<T, act::Full, D>::empty(*dev_, side_shape(ctx.in.batch), spread_, Category::activations);
        ctx.side.grad = Tensor<T, act::Full, D>::zeros(*dev_, side_shape(ctx.in.batch), spread_, Category::activations);
        ctx.x = embedding.forward(ctx.embedding, ctx.in, ctx.side.value, mesh);
      } else {
        ctx.x = embedding.forward(ctx.embedding, ctx.in, mesh);
      }
    } else {
      with_env(ctx, mesh, [&](auto& env) { forward_rest(stage, ctx, env, mode); });
    }
  }

  template <AxisComms M>
  void backward(std::size_t stage, Ctx& ctx, M& mesh) {
    if (stage > 0) {
      with_env(ctx, mesh, [&](auto& env) { backward_rest(stage, ctx, env); });
    } else if constexpr (sided) {
      // The readers' shares summed over the tensor group; still shares over context (nn/side.hpp).
      if (spread_.tensor_degree > 1) mesh.comm(Axis::tensor).all_reduce(ctx.side.grad.span(), ReduceOp::sum);
      embedding.backward(ctx.embedding, ctx.x, ctx.side.grad, mesh);
      ctx.x = {};
    } else {
      embedding.backward(ctx.embedding, ctx.x, mesh);
      ctx.x = {};
    }
  }

  // f(name, param) for every parameter, in a fixed order (the same for every strategy).
  // (Parameters of the parts this rank holds; the head's copy of the tied table is not listed.)
  template <class F>
  void for_each_param(F&& f) {
    if (place_.embedding) embedding.for_each_param("", f);
    for (std::int64_t l = 0; l < config.layers; ++l)
      if (const int b = block_at_[static_cast<std::size_t>(l)]; b >= 0)
        blocks[static_cast<std::size_t>(b)].for_each_param(Spec::block_name(l), f);
    if (place_.head) head.for_each_param("", f);
  }

  void zero_grad() {
    for (Unit& u : units_) u.zero_grad();
  }

 private:
  // f(the mesh the blocks and head see, nn::StageMesh): the micro-batch's weight, a sided model's side
  // input, a padded model's lengths.
  template <AxisComms M, class F>
  void with_env(Ctx& ctx, M& mesh, F&& f) {
    const std::int32_t* lengths = nullptr;  // the device's copy
    if constexpr (padded) lengths = std::span<const std::int32_t>(ctx.in.lengths).data();
    StageMesh<M, T, D, sided, padded> env(mesh, ctx.in.grad_scale, &ctx.side, lengths, ctx.lengths);
    f(env);
  }

  template <class M>
  void forward_rest(std::size_t stage, Ctx& ctx, M& mesh, Mode mode) {
    if (stage + 1 < stages()) {
      BlockT& b = block(stage - 1);
      // An error inside the block names it and the layers it was raised in (nn::within).
      ctx.x = within([&] { return Spec::block_name(static_cast<std::int64_t>(stage - 1)); },
                     [&] {
                       if (mode == Mode::train) {
                         return b.forward(ctx.blocks[stage - 1], ctx.x, mesh);
                       } else if constexpr (requires { b.infer(ctx.x, mesh); }) {
                         return b.infer(ctx.x, mesh);
                       } else {  // a block without its own infer (a Sequential): a scratch context, freed here
                         typename BlockT::Ctx scratch;
                         return b.forward(scratch, ctx.x, mesh);
                       }
                     });
    } else {
      if constexpr (tied) ctx.loss = head.forward(ctx.head, ctx.x, table(), ctx.in, mesh, mode);
      else ctx.loss = head.forward(ctx.head, ctx.x, ctx.in, mesh, mode);
      ctx.x = {};
    }
  }
  template <class M>
  void backward_rest(std::size_t stage, Ctx& ctx, M& mesh) {
    if (stage + 1 == stages()) {
      if constexpr (tied) ctx.x = head.backward(ctx.head, table(), ctx.in.grad_scale, mesh);
      else ctx.x = head.backward(ctx.head, ctx.in.grad_scale, mesh);
    } else {
      ctx.x = within([&] { return Spec::block_name(static_cast<std::int64_t>(stage - 1)); },
                     [&] { return block(stage - 1).backward(ctx.blocks[stage - 1], ctx.x, mesh); });
    }
  }

  BlockT& block(std::size_t l) {
    const int b = block_at_[l];
    if (b < 0)
      throw Error(Spec::name(), cat("block ", l, " is not held by this rank"), "run only the stages this rank holds");
    return blocks[static_cast<std::size_t>(b)];
  }
  // The tied head's table: the embedding's where this rank holds it, else the head's copy.
  auto& table()
    requires tied
  {
    return place_.embedding ? embedding.tied_table() : head_table;
  }

  Parts place_;
  D* dev_;
  Spread spread_;
  std::vector<int> block_at_;                          // global block -> index in blocks, or -1
  std::vector<std::vector<std::size_t>> stage_units_;  // per stage: the units it uses
  std::optional<std::size_t> tied_;
  bool tied_copy_ = false;
  int data_degree_ = 1;
  std::vector<Unit> units_;
};

}  // namespace weft::nn
