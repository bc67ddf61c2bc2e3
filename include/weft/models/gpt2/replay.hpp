// weft::footprint::step: the peak bytes of GPT-2's training step by category, from the sizes, the
// degrees and the types alone, constexpr: a closed-form replay of what cost/measure.hpp measures for
// any model on the Meta device. It stays for what the measurement cannot give: a plan in a
// constant expression (a static_assert on a step's peak), and a plan of sizes the Meta device
// would take long to run (docs/plan.md, "Two planners").
//
// The step is replayed on a Ledger that counts as the allocators do: every tensor the layers,
// redistributions and the data-parallel protocol allocate and free during one micro-batch's forward
// and backward (pipeline::forward_backward) and the optimizer step (DataParallel::step), in the
// order the code runs them. The peak of each category, and of their total, is where the replay's
// running count is highest. tests/models/gpt2/replay.cpp checks it equals what the host allocator measures
// for every data-parallel strategy, with and without sequence parallelism and under every
// recompute policy: a layer that changes what it keeps must change its replay here too.
//
// What a rank keeps between forward and backward, per block (local sizes; xs the residual stream
// (B/dp, T or T/tp with SP, C), xf the branch input (B/dp, T, C), stats two rows of S per stream
// row):
//   None       ln1 and ln2 input and stats (2 xs, 2 stats), qkv input (xf), qkv output (3C/tp),
//              attention probabilities (B/dp, H/tp, T, T), proj input (C/tp), fc input (xf),
//              fc pre-activation and proj input (2 x 4C/tp)
//   Selective  the same without the probabilities (recomputed in backward)
//   Full       the block input alone (xs); the rest is rebuilt in backward
// plus the head's logits (B/dp, T, Vp/tp) and the LM head's input (xf), which are usually the peak.
//
// step(): one pipe rank holding every stage (pipe degree 1). pipeline_step(): a pipe rank of a
// pipeline schedule's table (pipeline/schedule.hpp: GPipe, 1F1B, interleaved, ZB-H1), its micro-
// batches in flight, the activations and gradients it receives, the send buffers it keeps until a
// receive proves them delivered (pipeline::delivered) or the run ends, and under ZB-H1 the Linear layers' input copies
// and output gradients kept from each backward to its weight pass. Both on a device that reads the tokens where they
// are (the host); the CUDA back end's attention and GEMM workspaces are not replayed (cuda_workspace() below).
#pragma once

#include <cstdint>

#include "weft/cost/ledger.hpp"
#include "weft/cost/memory.hpp"
#include "weft/layout/transition.hpp"
#include "weft/models/gpt2/footprint.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/recompute/policies.hpp"

namespace weft::footprint {

namespace detail {

template <class Strategy, PrecisionLike P, bool SP, recompute::Policy R, class Rule>
class StepReplay {
  using T = typename precision_t<P>::compute;
  using G = master_t<T>;  // parameter gradients
  using S = master_t<T>;  // LayerNorm and cross-entropy statistics
  using A = typename nn::stream<SP>::layout;
  using Enter = typename nn::stream<SP>::enter;
  using Leave = typename nn::stream<SP>::leave;
  using Rows = Layout<Shard<0>, Replicate>;
  static constexpr bool shard_params = IsShard<typename Strategy::params>;
  static constexpr bool shard_grads = IsShard<typename Strategy::grads>;
  static constexpr bool shard_state = IsShard<typename Strategy::state>;
  static constexpr bool keep_probs = !std::same_as<R, recompute::Selective>;
  static constexpr std::int64_t e = sizeof(T), g = sizeof(G), sb = sizeof(S);
  static constexpr Category act = Category::activations, comm = Category::communication;

 public:
  constexpr StepReplay(const gpt2::Config& c, const Spread& s, std::int64_t micro, Ledger& l)
      : c_(c), s_(s), l_(&l), act_{micro, c.seq, c.width} {
    const std::int64_t C = c.width, dp = s.data_degree, tp = s.tensor_degree;
    const std::int64_t B = micro, Tn = c.seq;
    xs_ = numel<A>(act_) * e;
    xf_ = numel<nn::act::Full>(act_) * e;
    stats_ = 2 * (numel<A>(act_) / C) * sb;
    qkv_ = numel<nn::act::Features>({B, Tn, 3 * C}) * e;
    core_ = numel<nn::act::Features>({B, Tn, C}) * e;
    hidden_ = numel<nn::act::Features>({B, Tn, 4 * C}) * e;
    probs_ = B / dp * (c.heads / tp) * Tn * Tn * e;
    logits_ = numel<nn::act::Features>({B, Tn, nn::padded_vocab(c.vocab, s.tensor_degree)}) * e;
    rows_ = numel<Rows>({B, Tn}) * sb;
    const Units u = units(c, s);
    unit_embedding_ = padded(u.embedding(), dp);
    unit_block_ = padded(u.block, dp);
    unit_head_ = padded(u.head, dp);
    unit_table_ = padded(u.table, dp);
    unit_positions_ = padded(u.positions, dp);
  }

  // One micro-batch's forward and backward (pipeline::forward_backward over every stage).
  constexpr void forward_backward() {
    // Forward: stage 0, the blocks, the head (whose units stay acquired for the backward next).
    acquire(unit_embedding_, false, embedding_gathered_, embedding_grads_);
    embedding_forward();
    for (std::int64_t b = 0; b < c_.layers; ++b) {
      bool gathered = false, grads = false;
      acquire(unit_block_, false, gathered, grads);
      block_forward();
      l_->sub(act, xs_);  // ctx.x: the block's input, replaced by its output
      release(unit_block_, false, gathered, grads);
    }
    acquire(unit_head_, false, head_gathered_, head_grads_);
    acquire(unit_embedding_, false, embedding_gathered_, embedding_grads_);  // the tied table
    head_forward();
    // Backward: the head, the blocks in reverse, stage 0.
    acquire(unit_head_, true, head_gathered_, head_grads_);
    acquire(unit_embedding_, true, embedding_gathered_, embedding_grads_);
    head_backward();
    release(unit_head_, true, head_gathered_, head_grads_);
    for (std::int64_t b = c_.layers; b-- > 0;) {
      bool gathered = false, grads = false;
      acquire(unit_block_, true, gathered, grads);
      block_backward();
      l_->sub(act, xs_);  // ctx.x: the block's output gradient, replaced by its input gradient
      release(unit_block_, true, gathered, grads);
    }
    acquire(unit_embedding_, true, embedding_gathered_, embedding_grads_);
    embedding_backward();
    release(unit_embedding_, true, embedding_gathered_, embedding_grads_);
  }

  // DataParallel::step: the tensor-partial gradients packed into one all-reduce (SP), then under
  // ZeRO-1/2 each unit's updated slice copied out for the all-gather of values. `holds`: what this
  // rank holds (a pipe rank's stages; all of them by default).
  constexpr void optimizer_step(Holds holds = {-1, true, true}) {
    if (holds.blocks < 0) holds = Holds::all(c_);
    const bool split = holds.embedding != holds.head;  // the tied table a unit of its own, on two ranks
    if (SP && s_.tensor_degree > 1) {
      const std::int64_t packed = partial_grads(holds);
      l_->add(comm, packed * g);
      l_->sub(comm, packed * g);
    }
    if constexpr (shard_state && !shard_params) {
      const auto copy_out = [&](std::int64_t n) {
        l_->add(comm, n / s_.data_degree * e);
        l_->sub(comm, n / s_.data_degree * e);
      };
      if (holds.embedding) {
        if (split) {
          copy_out(unit_table_);
          copy_out(unit_positions_);
        } else {
          copy_out(unit_embedding_);
        }
      }
      for (std::int64_t b = 0; b < holds.blocks; ++b) copy_out(unit_block_);
      if (holds.head) {
        copy_out(unit_head_);
        if (split) copy_out(unit_table_);
      }
    }
  }

  // pipeline::Pipeline::run on pipe rank r of `t` (the even partition: L / (p V) blocks per
  // virtual stage, the embedding with stage 0, the head with the last): per action, in the table's
  // order, a receive allocates the activation or gradient it brings and frees the sends it proves
  // delivered; a forward or backward runs its stages, each unit acquired before and released after
  // it (released after the weight pass where the schedule splits it); the other sends are freed at
  // the run's end.
  constexpr void run_table(const pipeline::Table& t, int r) {
    const int S = t.stages();
    const std::int64_t per_stage = c_.layers / S;
    const bool embedding = r == 0, head = r == (S - 1) % t.p, split = embedding != head;
    defer_ = t.split_weight;
    // This rank's units: size and state. Indices: 0 the embedding (or wpe), 1 the table (split),
    // 2 the head, 3 the head's table copy (split), 4 + k the k-th block of this rank.
    struct U {
      std::int64_t n = 0;
      bool gathered = false, grads = false;
    };
    std::vector<U> u(static_cast<std::size_t>(4 + c_.layers / t.p));
    u[0].n = split ? unit_positions_ : unit_embedding_;
    u[1].n = unit_table_;
    u[2].n = unit_head_;
    u[3].n = unit_table_;
    for (std::size_t k = 4; k < u.size(); ++k) u[k].n = unit_block_;
    // The units of a fine stage: kind 0 the embedding, 1 block k (this rank's k-th), 2 the head.
    const auto units_of = [&](int kind, std::int64_t k, std::size_t* out) -> int {
      if (kind == 0) {
        out[0] = 0;
        out[1] = 1;
        return split ? 2 : 1;
      }
      if (kind == 1) {
        out[0] = static_cast<std::size_t>(4 + k);
        return 1;
      }
      out[0] = 2;
      out[1] = split ? 3 : 0;
      return 2;
    };
    // Visits the fine stages of virtual stage st, in forward order (reverse: backward order).
    const auto fine = [&](int st, bool reverse, auto&& f) {
      const std::int64_t first_local = static_cast<std::int64_t>(st / t.p) * per_stage;  // this rank's block index
      const bool has_embedding = st == 0, has_head = st == S - 1;
      if (!reverse) {
        if (has_embedding) f(0, 0);
        for (std::int64_t b = 0; b < per_stage; ++b) f(1, first_local + b);
        if (has_head) f(2, 0);
      } else {
        if (has_head) f(2, 0);
        for (std::int64_t b = per_stage; b-- > 0;) f(1, first_local + b);
        if (has_embedding) f(0, 0);
      }
    };
    const std::vector<int> delivered = pipeline::delivered(t, r);
    std::vector<std::int64_t> freed_at(delivered.size(), 0);  // per action: sends known delivered after its receive
    std::int64_t held = 0;                                    // sends kept until the end of the run
    for (std::size_t k = 0; k < delivered.size(); ++k) {
      const pipeline::Action& x = t.ranks[static_cast<std::size_t>(r)][k];
      if (x.what != pipeline::Do::exchange || !x.send.present()) continue;
      if (delivered[k] < 0) ++held;
      else ++freed_at[static_cast<std::size_t>(delivered[k])];
    }
    for (std::size_t k = 0; k < delivered.size(); ++k) {
      const pipeline::Action& a = t.ranks[static_cast<std::size_t>(r)][k];
      if (a.what == pipeline::Do::exchange) {
        // A send keeps its buffer (moved in from the context); a receive allocates c.x, then frees
        // the sends it proves delivered.
        if (a.recv.present()) {
          l_->add(act, xs_);
          l_->sub(act, freed_at[k] * xs_);
        }
        continue;
      }
      fine(a.stage, a.what != pipeline::Do::forward, [&](int kind, std::int64_t k) {
        std::size_t ids[2];
        const int n = units_of(kind, k, ids);
        const bool backward = a.what != pipeline::Do::forward;
        const bool values = a.what != pipeline::Do::weight;
        for (int i = 0; i < n; ++i) acquire(u[ids[i]].n, backward, u[ids[i]].gathered, u[ids[i]].grads, values);
        if (a.what == pipeline::Do::forward) {
          if (kind == 0) embedding_forward();
          if (kind == 1) {
            block_forward();
            l_->sub(act, xs_);
          }
          if (kind == 2) head_forward();
        } else if (a.what == pipeline::Do::backward) {
          if (kind == 0) embedding_backward();
          if (kind == 1) {
            block_backward();
            l_->sub(act, xs_);
          }
          if (kind == 2) head_backward();
        } else if (kind == 1) {
          block_weight();
        }
        if (a.what != pipeline::Do::backward || !t.split_weight)
          for (int i = 0; i < n; ++i) release(u[ids[i]].n, backward, u[ids[i]].gathered, u[ids[i]].grads);
      });
    }
    l_->sub(act, held * xs_);  // the run's end: the remaining sends waited for, their buffers freed
  }

  // The gradient elements that are Partial on the tensor axis (SP: LayerNorm weights and biases,
  // the positions) inside this rank's reduction range of each unit: all of the unit, or its data
  // slice where gradients are sharded. Entries in their units' order (models/gpt2/model.hpp).
  constexpr std::int64_t partial_grads(Holds holds) const {
    const std::int64_t C = c_.width, tp = s_.tensor_degree;
    const Units u = units(c_, s_);
    const std::int64_t q = 3 * C / tp;
    // (offset, length) of each partial entry
    const std::array<std::array<std::int64_t, 2>, 1> embedding{{{u.table, u.positions}}};
    const std::int64_t ln2_at = 2 * C + q * C + q + C * C / tp + C;
    const std::array<std::array<std::int64_t, 2>, 2> block{{{0, 2 * C}, {ln2_at, 2 * C}}};
    const std::array<std::array<std::int64_t, 2>, 1> head{{{0, 2 * C}}};
    const auto in_range = [&](std::int64_t padded, const auto& entries) {
      const std::int64_t shard = padded / s_.data_degree;
      const std::int64_t lo = shard_grads ? s_.data_index * shard : 0, hi = shard_grads ? lo + shard : padded;
      std::int64_t n = 0;
      for (const auto& [at, len] : entries) {
        const std::int64_t a = at > lo ? at : lo, b = at + len < hi ? at + len : hi;
        if (a < b) n += b - a;
      }
      return n;
    };
    // the wpe unit, split from the table
    const std::array<std::array<std::int64_t, 2>, 1> positions{{{0, u.positions}}};
    const bool split = holds.embedding != holds.head;
    std::int64_t n = holds.blocks * in_range(unit_block_, block);
    if (holds.embedding) n += split ? in_range(unit_positions_, positions) : in_range(unit_embedding_, embedding);
    if (holds.head) n += in_range(unit_head_, head);
    return n;
  }

 private:
  template <LayoutType L>
  constexpr std::int64_t numel(const Shape& global) const {
    return local_shape<L>(global, s_).numel();
  }
  // redistribute<To>(x) with x in From (comm/redistribute.hpp): the result, counted in x's
  // category, stays allocated; each step's output and scratch are communication buffers, the
  // previous step's output freed after the next one is allocated. Returns the result's bytes.
  template <LayoutType From, LayoutType To>
  constexpr std::int64_t redistribute(Category c) {
    Shape local = local_shape<From>(act_, s_);
    const std::int64_t y = local_shape<To>(act_, s_).numel() * e;
    l_->add(c, y);
    std::int64_t held = 0;
    for (const StepKind& k : Transition<From, To>::steps) {
      if (k.collective == Collective::none) continue;
      const Shape out = step_shape(k, local, s_.degree(k.axis));
      const std::int64_t in_n = local.numel(), out_n = out.numel();
      std::int64_t scratch = 0;
      if (k.collective == Collective::all_gather && out.outer(out.normalize_dim(k.from_dim)) != 1) scratch = out_n;
      if (k.collective == Collective::reduce_scatter && local.outer(local.normalize_dim(k.to_dim)) != 1) scratch = in_n;
      if (k.collective == Collective::all_to_all) scratch = 2 * in_n;
      l_->add(comm, out_n * e);
      l_->add(comm, scratch * e);
      l_->sub(comm, scratch * e);
      l_->sub(comm, held);
      held = out_n * e;
      local = out;
    }
    l_->sub(comm, held);
    return y;
  }
  template <class Redist>
  constexpr std::int64_t forward_of(Category c) {
    return redistribute<typename Redist::In, typename Redist::Out>(c);
  }
  template <class Redist>
  constexpr std::int64_t backward_of(Category c) {
    return redistribute<typename Redist::GradOut, typename Redist::GradIn>(c);
  }

  // DataParallel::acquire and release of a unit of n padded elements (values: false for a weight
  // pass, which needs the gradient buffer alone).
  constexpr void acquire(std::int64_t n, bool backward, bool& gathered, bool& grads, bool values = true) {
    if (shard_params && values && !gathered) {
      l_->add(Category::parameters, n * e);
      gathered = true;
    }
    if (shard_grads && backward && !grads) {
      l_->add(Category::gradients, n * g);
      grads = true;
    }
  }
  constexpr void release(std::int64_t n, bool backward, bool& gathered, bool& grads) {
    if (shard_grads && backward) {
      l_->add(comm, n / s_.data_degree * g);  // this rank's reduce-scattered part
      l_->sub(Category::gradients, n * g);
      l_->sub(comm, n / s_.data_degree * g);
      grads = false;
    }
    if (shard_params && gathered) {
      l_->sub(Category::parameters, n * e);
      gathered = false;
    }
  }

  // LayerNorm::forward: the output, the statistics, the input's copy.
  constexpr void layernorm_forward() {
    l_->add(act, xs_);
    l_->add(act, stats_);
    l_->add(act, xs_);
  }
  // LayerNorm::backward (fused with the residual's gradient): dx, then the context freed.
  constexpr void layernorm_backward() {
    l_->add(act, xs_);
    l_->sub(act, stats_);
    l_->sub(act, xs_);
  }

  // Residual<Sequential<ln, Enter, inner, Leave>>::forward: each layer's output lives until the
  // sequence returns; the branch's output (xs) stays.
  template <class Inner>
  constexpr void branch_forward(Inner&& inner) {
    layernorm_forward();
    const std::int64_t entered = forward_of<Enter>(act);
    const std::int64_t out = inner();  // the Partial output, (B/dp, T, C)
    forward_of<Leave>(act);
    l_->sub(act, out);
    l_->sub(act, entered);
    l_->sub(act, xs_);  // the LayerNorm's output
  }
  // ...::backward: Leave's adjoint, the inner layer's backward, Enter's adjoint, the LayerNorm's;
  // then the intermediate gradients, in reverse. The branch's input gradient (xs) stays.
  template <class Inner>
  constexpr void branch_backward(Inner&& inner) {
    const std::int64_t left = backward_of<Leave>(act);
    const std::int64_t dinner = inner();
    const std::int64_t entered = backward_of<Enter>(act);
    layernorm_backward();
    l_->sub(act, entered);
    l_->sub(act, dinner);
    l_->sub(act, left);
  }

  constexpr std::int64_t attention_forward() {
    l_->add(act, qkv_);    // qkv output, kept
    l_->add(act, xf_);     // qkv input copy
    l_->add(act, probs_);  // probabilities
    l_->add(act, core_);   // the attention core's output
    l_->add(act, xf_);     // proj output (Partial)
    l_->add(act, core_);   // proj input copy
    l_->sub(act, core_);   // the core's output, a local
    if (!keep_probs) l_->sub(act, probs_);
    return xf_;
  }
  // With the weight gradients deferred (ZB-H1), each Linear keeps its input copy and its output
  // gradient (a copy, or the GELU's dpre moved in) until backward_weight.
  constexpr std::int64_t attention_backward() {
    l_->add(act, core_);            // proj dx (dcore)
    if (defer_) l_->add(act, xf_);  // proj's dy, kept
    else l_->sub(act, core_);       // proj's input copy
    if (!keep_probs) {
      l_->add(act, probs_);
      l_->add(act, core_);  // the recomputed core's output, freed at once
      l_->sub(act, core_);
    }
    l_->add(act, qkv_);              // dqkv
    l_->add(act, xf_);               // qkv dx
    if (defer_) l_->add(act, qkv_);  // qkv's dy (dqkv's copy), kept
    else l_->sub(act, xf_);          // qkv's input copy
    l_->sub(act, qkv_);              // the kept qkv
    l_->sub(act, probs_);
    l_->sub(act, qkv_);   // dqkv
    l_->sub(act, core_);  // dcore
    return xf_;
  }
  constexpr std::int64_t mlp_forward() {
    l_->add(act, hidden_);  // fc output
    l_->add(act, xf_);      // fc input copy
    l_->add(act, hidden_);  // pre-activation copy
    l_->add(act, xf_);      // proj output (Partial)
    l_->add(act, hidden_);  // proj input copy
    l_->sub(act, hidden_);  // fc output, a local
    return xf_;
  }
  constexpr std::int64_t mlp_backward() {
    l_->add(act, hidden_);               // proj dx
    if (defer_) l_->add(act, xf_);       // proj's dy, kept
    else l_->sub(act, hidden_);          // proj's input copy
    l_->add(act, hidden_);               // GELU's dpre (kept as fc's dy when deferred)
    l_->add(act, xf_);                   // fc dx
    if (!defer_) l_->sub(act, xf_);      // fc's input copy
    l_->sub(act, hidden_);               // pre-activation
    if (!defer_) l_->sub(act, hidden_);  // dpre
    l_->sub(act, hidden_);               // proj dx
    return xf_;
  }
  // Block::backward_weight: the four Linear contexts (input copies and output gradients).
  constexpr void block_weight() {
    l_->sub(act, xf_ + qkv_);     // qkv: x, dy
    l_->sub(act, core_ + xf_);    // proj: x, dy
    l_->sub(act, xf_ + hidden_);  // fc: x, dpre
    l_->sub(act, hidden_ + xf_);  // proj: x, dy
  }

  // Block::run_forward: the two branches; the attention branch's output freed at the end.
  constexpr void run_forward() {
    branch_forward([&] { return attention_forward(); });
    branch_forward([&] { return mlp_forward(); });
    l_->sub(act, xs_);
  }
  // What run_forward leaves in the context (freed by a Full-recompute forward).
  constexpr void drop_context() {
    l_->sub(act, 2 * (xs_ + stats_) + 2 * xf_ + qkv_ + (keep_probs ? probs_ : 0) + core_ + 2 * hidden_);
  }

  // Block::forward: the output (xs) stays, with the context.
  constexpr void block_forward() {
    run_forward();
    if constexpr (std::same_as<R, recompute::Full>) {
      l_->add(act, xs_);  // the input's copy, the whole context
      drop_context();
    }
  }
  // Block::backward: the input gradient (xs) stays; the context is gone.
  constexpr void block_backward() {
    if constexpr (std::same_as<R, recompute::Full>) {
      run_forward();  // rebuilds the context; its output is discarded
      l_->sub(act, xs_);
      l_->sub(act, xs_);  // the input's copy
    }
    branch_backward([&] { return mlp_backward(); });
    branch_backward([&] { return attention_backward(); });
    l_->sub(act, xs_);  // the MLP branch's input gradient
  }

  // EmbeddingStage::forward: the vocab-parallel lookup (Partial), redistributed to the stream.
  constexpr void embedding_forward() {
    l_->add(act, xf_);
    forward_of<Leave>(act);
    l_->sub(act, xf_);
  }
  // EmbeddingStage::backward: wte's gradient reads Leave's adjoint of dx, a temporary; then ctx.x
  // is freed.
  constexpr void embedding_backward() {
    l_->sub(act, backward_of<Leave>(act));
    l_->sub(act, xs_);
  }

  // TiedHeadStage::forward: ln_f, Enter, the logits and the cross-entropy's row statistics.
  constexpr void head_forward() {
    layernorm_forward();
    forward_of<Enter>(act);  // xr, kept for the head's weight gradient
    l_->sub(act, xs_);       // ln_f's output
    l_->add(act, logits_);
    l_->add(act, rows_);      // row max
    l_->add(act, 2 * rows_);  // (B, T, 2) statistics before their all-reduce
    l_->add(act, rows_);      // sum of exponentials
    l_->sub(act, 2 * rows_);
    l_->sub(act, xs_);  // ctx.x: the last block's output
  }
  constexpr void head_backward() {
    l_->sub(act, 2 * rows_);  // the cross-entropy's context; the logits become their gradient
    l_->add(act, xf_);        // dxr
    l_->sub(act, logits_);
    l_->sub(act, xf_);  // xr
    const std::int64_t entered = backward_of<Enter>(act);
    layernorm_backward();
    l_->sub(act, entered);
    l_->sub(act, xf_);  // dxr
  }

  gpt2::Config c_;
  Spread s_;
  Ledger* l_;
  Shape act_;  // (B, T, C), global
  std::int64_t xs_ = 0, xf_ = 0, stats_ = 0, qkv_ = 0, core_ = 0, hidden_ = 0, probs_ = 0, logits_ = 0, rows_ = 0;
  std::int64_t unit_embedding_ = 0, unit_block_ = 0, unit_head_ = 0, unit_table_ = 0, unit_positions_ = 0;
  bool defer_ = false;  // ZB-H1: the Linear weight gradients deferred to a weight pass
  bool embedding_gathered_ = false, embedding_grads_ = false, head_gathered_ = false, head_grads_ = false;
};

}  // namespace detail

// The peaks of one training step on a rank of a data x tensor mesh (pipe degree 1): `micro_batches`
// forward-backward passes of `micro_batch` sequences (global, over the data ranks) each, then the
// optimizer step, for a gpt2::Model<P, SP, R> under data-parallel Strategy with update rule Rule. Starts
// from the persistent state (persistent()); s.data_index picks the rank's data slice, which
// matters only for the SP gradients packed in the optimizer step.
template <class Strategy, PrecisionLike P, bool SP = false, recompute::Policy R = recompute::None,
          class Rule = optim::AdamW>
constexpr StepPeak step(const gpt2::Config& c, const Spread& s, std::int64_t micro_batch,
                        std::int64_t micro_batches = 1) {
  Ledger l(persistent<Strategy, P, Rule>(c, s, Holds::all(c)));
  detail::StepReplay<Strategy, P, SP, R, Rule> replay(c, s, micro_batch, l);
  for (std::int64_t m = 0; m < (micro_batches < 1 ? 1 : micro_batches); ++m) replay.forward_backward();
  replay.optimizer_step();
  return {l.peak(), l.total_peak(), l.current(), l.allocated(), l.allocations()};
}

// The peaks of one training step on pipe rank `rank` of a pipeline (pipeline/pipelined.hpp) running
// table `t` (any schedule: GPipe, 1F1B, interleaved, ZB-H1) over the even partition, on a data x
// pipe x tensor mesh: every forward, backward and weight pass of the rank's stages for the table's
// micro-batches of `micro_batch` sequences, the activations and gradients it receives, the sends it
// keeps until they are known delivered, then the optimizer step over the units it holds. Layers must
// divide into p V stages (pipeline::Partition::even).
template <class Strategy, PrecisionLike P, bool SP = false, recompute::Policy R = recompute::None,
          class Rule = optim::AdamW>
constexpr StepPeak pipeline_step(const gpt2::Config& c, const Spread& s, std::int64_t micro_batch,
                                 const pipeline::Table& t, int rank) {
  const int S = t.stages();
  const Holds holds{c.layers / t.p, rank == 0, rank == (S - 1) % t.p};
  Ledger l(persistent<Strategy, P, Rule>(c, s, holds));
  detail::StepReplay<Strategy, P, SP, R, Rule> replay(c, s, micro_batch, l);
  replay.run_table(t, rank);
  replay.optimizer_step(holds);
  return {l.peak(), l.total_peak(), l.current(), l.allocated(), l.allocations()};
}

// What the CUDA back end adds to the replay, an estimate not yet checked on a GPU: cuBLASLt's
// workspace (32 MiB per rank, held from the start: device/cuda/gemm.cuh) and the attention core's
// f32 scores, (B/dp, H/tp, T, T) in the forward and again in the backward, one at a time.
constexpr std::int64_t cuda_workspace(const gpt2::Config& c, const Spread& s, std::int64_t micro_batch) {
  return (std::int64_t{32} << 20) + micro_batch / s.data_degree * (c.heads / s.tensor_degree) * c.seq * c.seq * 4;
}

}  // namespace weft::footprint
