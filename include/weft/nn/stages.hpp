// The first and last stages of a decoder (nn::StagedModel's Embedding and Head): GPT-2's and the
// custom example's embedding with learned positions, and the head every weft model uses (Llama's
// embedding without positions is token_embedding.hpp). A stage maps the activation entering it to
// the one leaving it (forward) and back (backward), keeping what its backward needs in a context the
// caller owns, one per micro-batch in flight; forward with Mode::infer keeps nothing past the stage.
//
//   EmbeddingStage   the batch's tokens (B/dp, T) int32 -> x (B, T, C) in the stream layout A
//                    wte (Vp, C) Shard<0> on tensor (vocab-parallel), wpe (T, C) Replicate
//   TiedHeadStage    x (B, T, C) in A and the batch's targets -> loss; the final norm (C), the LM head tied to wte
//   (passed in
//                    by the model, which owns it in the embedding stage), the vocab-parallel cross-entropy
//   HeadStage        the same with an LM head table of its own (lm_head (Vp, C) Shard<0>)
//
// The stream layout A is (B, T, C) Replicate on tensor, or Shard<1> (B, T/tp, C) under sequence
// parallelism; Enter brings it to Replicate (all-reduce in backward, or all-gather), Leave brings a
// Partial sum back to A (all-reduce, or reduce-scatter).
#pragma once

#include <span>

#include "weft/context/attention.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/cross_entropy.hpp"
#include "weft/nn/embedding.hpp"
#include "weft/nn/layernorm.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/stream.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/ops/all.hpp"

namespace weft::nn {

template <Floating T, bool SP, class D = Host, context::Choice Cx = context::None>
class EmbeddingStage {
  static constexpr bool cp = context::Kind<Cx>;

 public:
  using A = typename stream<SP, cp>::layout;
  using Leave = typename stream<SP>::leave;

  struct Ctx {
    typename VocabParallelEmbedding<T, D>::Ctx wte;
    std::vector<std::int32_t> rows;  // context parallelism: the tokens of this rank's rows (B/dp, T/c)
  };

  VocabParallelEmbedding<T, D> wte;  // (Vp, C), also the LM head
  PositionEmbedding<T, A, D> wpe;    // (T, C)

  EmbeddingStage() = default;
  EmbeddingStage(D& dev, std::int64_t padded_vocab, std::int64_t seq, std::int64_t C, const Spread& s,
                 std::uint64_t seed, double init_std)
      : wte(dev, padded_vocab, C, s, 0, seed, init_std), wpe(dev, seq, C, s, 1, seed, init_std / 2) {}

  // tokens (B/dp, T) -> x (B, T, C) in A: the vocab-parallel lookup is Partial; the position rows
  // are added after the reduction. Under context parallelism the tokens and positions are those of
  // the context rank's rows (context::Chunks).
  template <AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const MicroBatch& in, M& mesh) {
    const std::int64_t seq = seq_of(in, wte.weight.value.spread().data_degree);
    auto x = [&] {
      if constexpr (!cp) return Leave::forward(wte.forward(ctx.wte, in.tokens, in.batch, seq), mesh);
      else return lookup_rows<A, Leave>(wte, ctx.wte, ctx.rows, in.tokens, in.batch, seq, mesh);
    }();
    wpe.forward(x);
    return x;
  }

  template <AxisComms M>
  void backward(Ctx& ctx, const Tensor<T, A, D>& dx, M& mesh) {
    wpe.backward(dx);  // under SP each rank adds its own positions: Partial on tensor
    if constexpr (!cp) wte.backward(ctx.wte, Leave::backward(dx, mesh));  // (B, T, C) Replicate
    else lookup_rows_backward<Leave>(wte, ctx.wte, ctx.rows, dx, mesh);
  }

  // The stage's rows of the model's plan (describe.hpp): act the global (B, T, C).
  static void comm_rows(std::vector<CommRow>& out, const Shape& act, const Spread& s, std::int64_t e) {
    out.push_back(
        detail::pair_row<Leave>("embedding (vocab-parallel) -> stream", detail::context_rows<cp>(act, s), s, e));
  }

  // The LM head's tied table (TiedHeadStage::Table), and its parameter's name.
  static std::string tied_name() { return "wte"; }
  auto& tied_table() { return wte.weight; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    wte.for_each_param(prefix + "wte", f);
    wpe.for_each_param(prefix + "wpe", f);
  }
};

// Norm: the final norm's layer over the stream (LayerNorm by default; any layer with the same
// constructor (dev, C, spread, first id, seed), forward(ctx, x) and backward(ctx, dy)).
//
// With context parallelism (Cx = context::Ring or context::AllGather) the stream is a context rank's
// rows (T / c): the stage runs on them as on a sequence of their own, with the targets at their
// positions (context::Chunks::rows), and the loss sums over the context group as over the data group
// (VocabParallelCrossEntropy::context_rows).
template <Floating T, bool SP, class D = Host, class Norm = LayerNorm<T, typename stream<SP>::layout, D>,
          context::Choice Cx = context::None>
class TiedHeadStage {
  static constexpr bool cp = context::Kind<Cx>;
  using Local = typename stream<SP>::layout;  // the norm's layout (on a context rank's rows under Cx)

 public:
  using A = typename stream<SP, cp>::layout;
  using Enter = typename stream<SP>::enter;
  using Table = Param<T, Layout<Replicate, Shard<0>>, Layout<Replicate, Shard<0>>, D>;  // the tied wte, (Vp, C)
  using S = master_t<T>;

  struct Ctx {
    typename Norm::Ctx ln_f;
    Tensor<T, act::Full, D> xr;                        // (B, T, C) Replicate: the LM head's input, for dW
    typename VocabParallelCrossEntropy<T, D>::Ctx ce;  // logits (B, T, Vp) Shard<-1> in ce.logits
    std::vector<std::int32_t> rows;  // context parallelism: the targets of this rank's rows (B/dp, T/c)
  };

  Norm ln_f;
  VocabParallelCrossEntropy<T, D> ce;

  TiedHeadStage() = default;
  // ln_f's parameter ids: ln_id and ln_id + 1 (8 and 9 in GPT-2).
  TiedHeadStage(D& dev, std::int64_t vocab, std::int64_t C, const Spread& s, std::uint64_t seed,
                std::uint64_t ln_id = 8)
      : ln_f(dev, C, s, ln_id, seed), ce(vocab) {
    ce.context_rows = cp;
  }

  // x (B, T, C) in A and the batch's targets (B/dp, T) -> the mean loss over the global batch. With
  // Mode::infer only the logits are kept (in ctx.ce.logits, for sampling).
  template <AxisComms M>
  double forward(Ctx& ctx, const Tensor<T, A, D>& x, const Table& table, const MicroBatch& in, M& mesh,
                 Mode mode = Mode::train) {
    const std::span<const std::int32_t> targets = in.targets;
    if constexpr (!cp) {
      return forward_rows(ctx, x, table, targets, mesh, mode);
    } else {
      static_assert(D::host_memory, "TiedHeadStage: context parallelism takes its rows in host memory so far");
      auto& cg = mesh.comm(Axis::context);
      ctx.rows = context::Chunks::of(x.global_shape()[1], cg.size()).rows(targets, cg.rank());
      Shape g = x.global_shape();
      g[1] /= x.spread().context_degree;  // the rank's rows (T / c), split over tensor under SP
      return forward_rows(ctx, Tensor<T, Local, D>::view(x.dev(), const_cast<T*>(x.data()), g, x.spread()), table,
                          ctx.rows, mesh, mode);
    }
  }

  // -> dx (B, T, C) in A; accumulates the table's and ln_f's gradients. grad_scale multiplies
  // every gradient (1/k when accumulating k micro-batches).
  template <AxisComms M>
  Tensor<T, A, D> backward(Ctx& ctx, Table& table, double grad_scale, M& mesh) {
    if constexpr (!cp) {
      return backward_rows(ctx, table, grad_scale, mesh);
    } else {
      auto dx = backward_rows(ctx, table, grad_scale, mesh);  // (B, T/c, C): the rows
      Shape g = dx.global_shape();
      g[1] *= dx.spread().context_degree;
      return Tensor<T, A, D>::relabel(std::move(dx), g);
    }
  }

 private:
  template <AxisComms M>
  double forward_rows(Ctx& ctx, const Tensor<T, Local, D>& x, const Table& table, std::span<const std::int32_t> targets,
                      M& mesh, Mode mode) {
    typename Norm::Ctx ln_scratch;
    auto xr = Enter::forward(ln_f.forward(mode == Mode::train ? ctx.ln_f : ln_scratch, x), mesh);  // Replicate
    const std::int64_t C = xr.local_shape()[2], N = xr.numel() / C, Vl = table.value.local_shape()[0];
    auto logits = Tensor<T, act::Features, D>::empty(
        xr.dev(), {xr.global_shape()[0], xr.global_shape()[1], table.value.global_shape()[0]}, xr.spread(),
        Category::activations);  // (B, T, Vp) Shard<-1>
    ops::Gemm<D>::run(xr.dev(), Trans::no, Trans::yes, N, Vl, C, S(1), xr.data(), C, table.value.data(), C, S(0),
                      logits.data(), Vl);
    const double loss = ce.forward(ctx.ce, std::move(logits), targets, mesh);
    if (mode == Mode::train) {
      ctx.xr = std::move(xr);
    } else {
      ctx.ce.rowmax = {};
      ctx.ce.sumexp = {};
    }
    return loss;
  }

  template <AxisComms M>
  Tensor<T, Local, D> backward_rows(Ctx& ctx, Table& table, double grad_scale, M& mesh) {
    auto dlogits = ce.backward(ctx.ce, grad_scale);  // (B, T, Vp) Shard<-1>
    const Tensor<T, act::Full, D>& xr = ctx.xr;
    const std::int64_t C = xr.local_shape()[2], N = xr.numel() / C, Vl = dlogits.local_shape()[2];
    // dW (Vl, C) += dlogits^T xr;  dxr (N, C) = dlogits W: a Partial sum over the vocabulary shards.
    ops::Gemm<D>::run(xr.dev(), Trans::yes, Trans::no, Vl, C, N, S(1), dlogits.data(), Vl, xr.data(), C, S(1),
                      table.grad.data(), C);
    auto dxr = Tensor<T, act::Partial, D>::empty(xr.dev(), xr.global_shape(), xr.spread(), Category::activations);
    ops::Gemm<D>::run(xr.dev(), Trans::no, Trans::no, N, C, Vl, S(1), dlogits.data(), Vl, table.value.data(), C, S(0),
                      dxr.data(), C);
    dlogits = {};
    ctx.xr = {};
    auto dx = ln_f.backward(ctx.ln_f, Enter::backward(dxr, mesh));
    ctx = Ctx{};
    return dx;
  }

 public:
  // The stage's rows of the model's plan (describe.hpp): c the model's configuration (its vocab),
  // act the global (B, T, C), e the bytes of an element.
  template <class C>
  static void comm_rows(std::vector<CommRow>& out, const C& c, const Shape& act, const Spread& s, std::int64_t e) {
    const std::int64_t vocab = c.vocab, padded_vocab = nn::padded_vocab(c.vocab, s.tensor_degree);
    const Shape local = detail::context_rows<cp>(act, s);           // the rows the norm and the head see
    const std::int64_t rows = local[0] / s.data_degree * local[1];  // local (B, T) positions
    out.push_back({"ln_f", A::name(), A::name(), {}, {}});
    out.push_back(detail::pair_row<Enter>("ln_f -> LM head", local, s, e));
    out.push_back({cat("LM head (tied, vocab-parallel: ", padded_vocab / s.tensor_degree, " of ", vocab, " rows)"),
                   act::Full::name(),
                   act::Features::name(),
                   {},
                   {}});
    // the row statistics in the accumulation type (VocabParallelCrossEntropy's S: f32 under bf16)
    const auto se = static_cast<std::int64_t>(sizeof(accumulate_t<T>));
    out.push_back({"cross-entropy (row max, then sum exp + target)",
                   act::Features::name(),
                   "loss",
                   {detail::reduction(Axis::tensor, s.tensor_degree, rows * se),
                    detail::reduction(Axis::tensor, s.tensor_degree, 2 * rows * se)},
                   {}});
    out.push_back(
        {"loss (mean over the global batch)", "loss", "loss", {detail::reduction(Axis::data, s.data_degree, 8)}, {}});
    if constexpr (cp)  // each context rank's rows' sum, before the mean
      out.back().forward.insert(out.back().forward.begin(), detail::reduction(Axis::context, s.context_degree, 8));
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    ln_f.for_each_param(prefix + "ln_f", f);
  }
};

// A head with its own LM head table (untied, as in Llama): ln_f, the vocab-parallel LM head
// (Vp, C) Shard<0> on tensor, and the cross-entropy; the same computation as TiedHeadStage with the
// table held here, initialized normal(0, init_std) from its own parameter id and weight-decayed as
// a Linear matrix is.
template <Floating T, bool SP, class D = Host, class Norm = LayerNorm<T, typename stream<SP>::layout, D>,
          context::Choice Cx = context::None>
class HeadStage {
  using Core = TiedHeadStage<T, SP, D, Norm, Cx>;

 public:
  using A = typename Core::A;
  using Ctx = typename Core::Ctx;

  Core core;                     // ln_f, the cross-entropy
  typename Core::Table lm_head;  // (Vp, C) Shard<0>

  HeadStage() = default;
  // ids: ln_f's weight and bias are ln_id and ln_id + 1, the table table_id.
  HeadStage(D& dev, std::int64_t vocab, std::int64_t padded_vocab, std::int64_t C, const Spread& s, std::uint64_t seed,
            std::uint64_t ln_id, std::uint64_t table_id, double init_std)
      : core(dev, vocab, C, s, seed, ln_id),
        lm_head(dev, {padded_vocab, C}, s, table_id, {Init::normal, init_std}, seed, Decay::yes) {}

  template <AxisComms M>
  double forward(Ctx& ctx, const Tensor<T, A, D>& x, const MicroBatch& in, M& mesh, Mode mode = Mode::train) {
    return core.forward(ctx, x, lm_head, in, mesh, mode);
  }
  template <AxisComms M>
  Tensor<T, A, D> backward(Ctx& ctx, double grad_scale, M& mesh) {
    return core.backward(ctx, lm_head, grad_scale, mesh);
  }

  template <class C>
  static void comm_rows(std::vector<CommRow>& out, const C& c, const Shape& act, const Spread& s, std::int64_t e) {
    Core::comm_rows(out, c, act, s, e);
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    core.for_each_param(prefix, f);
    f(prefix + "lm_head", lm_head);
  }
};

}  // namespace weft::nn
