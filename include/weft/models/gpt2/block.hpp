// gpt2::Block<T, SequenceParallel, Recompute>: GPT-2's pre-LayerNorm transformer block,
//   x = x + attn(ln1(x));  x = x + mlp(ln2(x))
//
// The residual stream A is (B, T, C) Replicate, or Shard<1> (B, T/tp, C) with sequence parallelism.
// Around each branch (Megatron):
//   without SP: CopyToTensor before (backward all-reduce), ReduceFromTensor after (forward all-reduce)
//               -> 2 all-reduces forward, 2 backward per block
//   with SP:    GatherFromSequence before (all-gather; backward reduce-scatter), ScatterToSequence after
//               (reduce-scatter; backward all-gather) -> 2 all-gathers and 2 reduce-scatters each way
// Under SP the LayerNorm parameter gradients are partial sums over each rank's sequence slice: their
// layout is Partial on the tensor axis, and the data-parallel step reduces them once per step with
// every other gradient (no collective for them inside a block).
#pragma once

#include <cmath>

#include "weft/nn/comm.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/layernorm.hpp"
#include "weft/nn/mlp.hpp"
#include "weft/nn/plan_row.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/stream.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/recompute/checkpointed.hpp"
#include "weft/recompute/policies.hpp"

namespace weft::gpt2 {

// The block itself; Block (below) applies the recompute policy to it. Recompute reaches the
// attention (Selective: the probabilities are rebuilt from qkv) and the plan rows (Full: each
// branch's forward collectives again in backward).
//
// With context parallelism (Cx = context::Ring or context::AllGather) the stream is a context rank's
// rows (Shard<1> on context): the attention runs over the context group, and the norms and the MLP
// on the rank's rows (TokenWise).
template <Floating T, bool SP, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
class PreNormBlock {
  static constexpr bool cp = context::Kind<Cx>;
  using Local = nn::stream<SP>;  // the layers' own layouts (on a context rank's rows under Cx)
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;

 public:
  using A = typename nn::stream<SP, cp>::layout;
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  using value_type = T;
  using device = D;
  using In = A;
  using Out = A;
  using GradIn = A;
  using GradOut = A;

  // The two branches as typed compositions: Sequential checks every boundary's layouts at compile
  // time (ln -> Enter -> the Replicate-in, Partial-out layer -> Leave back to A), and Residual that
  // each branch returns to its input layout.
  using Ln = nn::LayerNorm<T, typename Local::layout, D>;
  using Attn = nn::GroupedQueryAttention<T, Recompute, D, Cx>;  // multi-head: kv_heads = heads, biased, not rotated
  using MlpT = nn::Mlp<T, D>;
  using AttnBranch = nn::Residual<nn::Sequential<on_rows<nn::Named<"ln1", Ln>>, Enter, nn::Named<"attn", Attn>, Leave>>;
  using MlpInner =
      nn::Sequential<nn::Named<"ln2", Ln>, typename Local::enter, nn::Named<"mlp", MlpT>, typename Local::leave>;
  using MlpBranch = nn::Residual<on_rows<MlpInner>>;

  struct Ctx {
    typename AttnBranch::Ctx attn;
    typename MlpBranch::Ctx mlp;
  };

  AttnBranch attn;
  MlpBranch mlp;

  // id: first parameter id of this block (it uses id .. id + 11).
  PreNormBlock(D& dev, std::int64_t C, std::int64_t H, std::int64_t layers, const Spread& s, std::uint64_t id,
               std::uint64_t seed, double init_std = 0.02)
      : attn(typename AttnBranch::inner_type(
            on_rows<nn::Named<"ln1", Ln>>(nn::Named<"ln1", Ln>(Ln(dev, C, s, id, seed))), Enter{},
            nn::Named<"attn", Attn>(Attn::multi_head(dev, C, H, s, id + 4, seed, init_std,
                                                     init_std / std::sqrt(2.0 * static_cast<double>(layers)))),
            Leave{})),
        mlp(typename MlpBranch::inner_type(
            MlpInner(nn::Named<"ln2", Ln>(Ln(dev, C, s, id + 2, seed)), {},
                     nn::Named<"mlp", MlpT>(MlpT(dev, C, s, id + 8, seed, init_std,
                                                 init_std / std::sqrt(2.0 * static_cast<double>(layers)))),
                     {}))) {}

  template <AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x, M& mesh) {
    auto x2 = attn.forward(ctx.attn, x, mesh);  // x + attn(ln1(x))
    return mlp.forward(ctx.mlp, x2, mesh);      // x2 + mlp(ln2(x2))
  }

  // Forward that keeps nothing (evaluation): the block's saved tensors die with a scratch context.
  template <AxisComms M>
  Tensor<T, A, D> infer(const Tensor<T, A, D>& x, M& mesh) {
    Ctx scratch;
    return forward(scratch, x, mesh);
  }

  template <AxisComms M>
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dout, M& mesh) {
    auto dx2 = mlp.backward(ctx.mlp, dout, mesh);  // Leave, mlp, Enter, ln2, + dout
    auto dx = attn.backward(ctx.attn, dx2, mesh);  // Leave, attn, Enter, ln1, + dx2
    if (!deferring_) ctx = Ctx{};
    return dx;
  }

  // Zero-bubble schedules: with deferral on, backward() leaves the four Linear layers' weight
  // gradients for backward_weight(), which adds them and frees the context.
  void defer_weight(bool on) {
    deferring_ = on;
    attn.defer_weight(on);
    mlp.defer_weight(on);
  }
  void backward_weight(Ctx& ctx) {
    attn.backward_weight(ctx.attn);
    mlp.backward_weight(ctx.mlp);
    ctx = Ctx{};
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Block"; }  // (PreNormBlock)

  // This block's rows of the model's plan (describe.hpp): act is the global (B, T, C), e the bytes
  // of an element. Full recompute repeats each branch's forward collectives in its backward. With
  // context parallelism and the head count, the attention's own collectives on the context axis.
  static void plan_rows(std::vector<nn::PlanRow>& out, const std::string& prefix, const Shape& act, const Spread& s,
                        std::int64_t e, std::int64_t heads = 0) {
    const std::string p = prefix + ".";
    for (const char* branch : {"attn", "mlp"}) {
      const bool attn_branch = branch[0] == 'a';
      out.push_back({p + (attn_branch ? "ln1" : "ln2"), A::name(), A::name(), {}, {}});
      out.push_back(nn::detail::pair_row<Enter>(p + branch + " enter", act, s, e));
      if (attn_branch) {
        out.push_back(nn::detail::local_row<nn::Linear<T, nn::ColumnParallel>>(p + "attn.qkv (ColumnParallel)"));
        out.push_back({p + (cp ? cat("attn.core (causal, local heads, over context: ", Cx::name, ")")
                               : "attn.core (causal, local heads)"),
                       nn::act::Features::name(),
                       nn::act::Features::name(),
                       {},
                       {}});
        if constexpr (cp)
          if (heads > 0)  // the keys and values of the rank's rows: (B/dp, T/c, H/tp, 2, hd)
            nn::detail::ContextAttention<Cx>::template add_steps<T>(out.back(), act, s, e, heads / s.tensor_degree,
                                                                    act[2] / heads);
        out.push_back(nn::detail::local_row<nn::Linear<T, nn::RowParallel>>(p + "attn.proj (RowParallel)"));
      } else {
        out.push_back(nn::detail::local_row<nn::Linear<T, nn::ColumnParallel, nn::epilogue::Gelu>>(
            p + "mlp.fc (ColumnParallel, GELU)"));
        out.push_back(nn::detail::local_row<nn::Linear<T, nn::RowParallel>>(p + "mlp.proj (RowParallel)"));
      }
      out.push_back(nn::detail::pair_row<Leave>(p + branch + " leave", act, s, e));
      if constexpr (std::same_as<Recompute, recompute::Full>)  // backward re-runs the forward's collectives
        for (std::size_t i = out.size() - (attn_branch ? 5 : 4); i < out.size(); ++i)
          out.back().backward.insert(out.back().backward.end(), out[i].forward.begin(), out[i].forward.end());
    }
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    attn.for_each_param(prefix, f);  // prefix.ln1.*, prefix.attn.*
    mlp.for_each_param(prefix, f);   // prefix.ln2.*, prefix.mlp.*
  }

 private:
  bool deferring_ = false;
};

// Block<T, SequenceParallel, Recompute>: the pre-LayerNorm block under its recompute policy (Full:
// recompute::Checkpointed, the same for every block; recompute/checkpointed.hpp).
template <Floating T, bool SP, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
using Block = recompute::apply_t<Recompute, PreNormBlock<T, SP, Recompute, D, Cx>>;

}  // namespace weft::gpt2
