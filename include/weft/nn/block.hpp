// Block<T, SequenceParallel, Recompute>: pre-LayerNorm transformer block,
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

#include <array>
#include <cmath>

#include "weft/nn/attention.hpp"
#include "weft/nn/comm.hpp"
#include "weft/nn/layernorm.hpp"
#include "weft/nn/plan_row.hpp"
#include "weft/recompute/policies.hpp"

namespace weft::nn {

template <bool SP>
struct stream {
  using layout = std::conditional_t<SP, act::Sequence, act::Replicated>;
  using enter = std::conditional_t<SP, GatherFromSequence, CopyToTensor>;    // stream -> Replicate
  using leave = std::conditional_t<SP, ScatterToSequence, ReduceFromTensor>; // Partial -> stream
};

template <Floating T, bool SP, recompute::Policy Recompute = recompute::None>
class Block {
 public:
  using A = typename stream<SP>::layout;
  using Enter = typename stream<SP>::enter;
  using Leave = typename stream<SP>::leave;

  struct Ctx {
    Tensor<T, A, Host> x;  // the block input (Full recompute keeps only this)
    typename LayerNorm<T, A>::Ctx ln1, ln2;
    typename CausalSelfAttention<T>::Ctx attn;
    typename Mlp<T>::Ctx mlp;
  };

  LayerNorm<T, A> ln1, ln2;
  CausalSelfAttention<T> attn;
  Mlp<T> mlp;

  Block() = default;
  // id: first parameter id of this block (it uses id .. id + 11).
  Block(Host& dev, std::int64_t C, std::int64_t H, std::int64_t layers, const Spread& s, std::uint64_t id,
        std::uint64_t seed, double init_std = 0.02)
      : ln1(dev, C, s, id, seed),
        ln2(dev, C, s, id + 2, seed),
        attn(dev, C, H, s, id + 4, seed, init_std, init_std / std::sqrt(2.0 * static_cast<double>(layers))),
        mlp(dev, C, s, id + 8, seed, init_std, init_std / std::sqrt(2.0 * static_cast<double>(layers))) {}

  template <AxisComms M>
  Tensor<T, A, Host> forward(Ctx& ctx, const Tensor<T, A, Host>& x, M& mesh) {
    if constexpr (std::same_as<Recompute, recompute::Full>) {
      Ctx scratch;
      auto y = run_forward(scratch, x, mesh);
      ctx = Ctx{};
      ctx.x = x.clone(Category::activations);
      return y;
    } else {
      return run_forward(ctx, x, mesh);
    }
  }

  // Forward that keeps nothing (evaluation): the block's saved tensors die with a scratch context.
  template <AxisComms M>
  Tensor<T, A, Host> infer(const Tensor<T, A, Host>& x, M& mesh) {
    Ctx scratch;
    return run_forward(scratch, x, mesh);
  }

  template <AxisComms M>
  Tensor<T, A, Host> backward(Ctx& ctx, const Tensor<T, A, Host>& dout, M& mesh) {
    if constexpr (std::same_as<Recompute, recompute::Full>) {
      Tensor<T, A, Host> x = std::move(ctx.x);
      ctx = Ctx{};
      run_forward(ctx, x, mesh);
    }
    auto dm = Leave::backward(dout, mesh);                         // (B, T, C) Replicate
    auto dh2 = Enter::backward(mlp.backward(ctx.mlp, dm), mesh);   // Partial -> stream
    auto dx2 = ln2.backward(ctx.ln2, dh2);
    Ops<Host>::add_inplace(dout.dev(), dx2.data(), dout.data(), dx2.numel());       // residual
    auto da = Leave::backward(dx2, mesh);
    auto dh1 = Enter::backward(attn.backward(ctx.attn, da), mesh);
    auto dx = ln1.backward(ctx.ln1, dh1);
    Ops<Host>::add_inplace(dout.dev(), dx.data(), dx2.data(), dx.numel());

    ctx = Ctx{};
    return dx;
  }

  // This block's rows of the model's plan (describe.hpp): act is the global (B, T, C), e the bytes
  // of an element. Full recompute repeats each branch's forward collectives in its backward.
  static void plan_rows(std::vector<PlanRow>& out, const std::string& prefix, const Shape& act, const Spread& s,
                        std::int64_t e) {
    const std::string p = prefix + ".";
    for (const char* branch : {"attn", "mlp"}) {
      const bool attn_branch = branch[0] == 'a';
      out.push_back({p + (attn_branch ? "ln1" : "ln2"), A::name(), A::name(), {}, {}});
      out.push_back(detail::pair_row<Enter>(p + branch + " enter", act, s, e));
      if (attn_branch) {
        out.push_back(detail::local_row<Linear<T, ColumnParallel>>(p + "attn.qkv (ColumnParallel)"));
        out.push_back({p + "attn.core (causal, local heads)", act::Features::name(), act::Features::name(), {}, {}});
        out.push_back(detail::local_row<Linear<T, RowParallel>>(p + "attn.proj (RowParallel)"));
      } else {
        out.push_back(detail::local_row<Linear<T, ColumnParallel, epilogue::Gelu>>(p + "mlp.fc (ColumnParallel, GELU)"));
        out.push_back(detail::local_row<Linear<T, RowParallel>>(p + "mlp.proj (RowParallel)"));
      }
      out.push_back(detail::pair_row<Leave>(p + branch + " leave", act, s, e));
      if constexpr (std::same_as<Recompute, recompute::Full>)  // backward re-runs the forward's collectives
        for (std::size_t i = out.size() - (attn_branch ? 5 : 4); i < out.size(); ++i)
          out.back().backward.insert(out.back().backward.end(), out[i].forward.begin(), out[i].forward.end());
    }
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    ln1.for_each_param(prefix + ".ln1", f);
    attn.for_each_param(prefix + ".attn", f);
    ln2.for_each_param(prefix + ".ln2", f);
    mlp.for_each_param(prefix + ".mlp", f);
  }

  void zero_grad() {
    ln1.zero_grad();
    ln2.zero_grad();
    attn.zero_grad();
    mlp.zero_grad();
  }

 private:
  template <AxisComms M>
  Tensor<T, A, Host> run_forward(Ctx& ctx, const Tensor<T, A, Host>& x, M& mesh) {
    constexpr bool keep_probs = !std::same_as<Recompute, recompute::Selective>;
    auto h1 = Enter::forward(ln1.forward(ctx.ln1, x), mesh);
    auto a = Leave::forward(attn.forward(ctx.attn, h1, keep_probs), mesh);
    Ops<Host>::add_inplace(x.dev(), a.data(), x.data(), a.numel());  // x2 = x + attn(ln1(x))
    auto h2 = Enter::forward(ln2.forward(ctx.ln2, a), mesh);
    auto y = Leave::forward(mlp.forward(ctx.mlp, h2), mesh);
    Ops<Host>::add_inplace(x.dev(), y.data(), a.data(), y.numel());  // x + mlp(ln2(x2))
    return y;
  }
};

}  // namespace weft::nn
