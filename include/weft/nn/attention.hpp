// CausalSelfAttention: fused QKV projection (ColumnParallel: heads split over tensor ranks), causal
// softmax attention on the local heads, output projection (RowParallel: out is Partial).
//
// The QKV weight (3C, C) orders its output features (head, {q, k, v}, head_dim), so a contiguous
// shard of rows holds whole heads with their q, k and v. (GPT-2 checkpoints order them (q|k|v,
// head, head_dim); the checkpoint adapter permutes rows.)
//
//   x     (B, T, C)          Replicate
//   qkv   (B, T, 3C/tp)      Shard<-1>   = (B, T, H/tp, 3, hd)
//   probs (B, H/tp, T, T)    per rank; kept, or recomputed in backward (Recompute = Selective)
//   y     (B, T, C/tp)       Shard<-1>
//   out   (B, T, C)          Partial
//
// With context parallelism (Cx = context::Ring or context::AllGather, docs/context.md) the sequence
// is sharded over the context axis in every layout above: each rank holds its T / c rows, and the
// attention runs over the mesh's context group (nn/context_attention.hpp). On the host, and compiled
// for the Cuda device (ops::ContextBlock).
#pragma once

#include <cmath>

#include "weft/nn/context_attention.hpp"
#include "weft/nn/linear.hpp"
#include "weft/ops/families.hpp"
#include "weft/recompute/policies.hpp"

namespace weft::nn {

template <Floating T, recompute::Policy Recompute = recompute::None, class D = Host, context::Choice Cx = context::None>
class CausalSelfAttention {
  static constexpr bool keep_probs = !std::same_as<Recompute, recompute::Selective>;
  static constexpr bool cp = context::Kind<Cx>;  // the sequence sharded over the context axis
  static_assert(
      !cp || is_meta<D> || ops::ImplementedOn<ops::ContextBlock, D>,
      "CausalSelfAttention: context parallelism (Cx) needs ops::ContextBlock on this device (ops/context_block.hpp; "
      "the Cuda device's in ops/context_block.cuh, which ops/families.cuh includes); include it, or "
      "use context::None");

 public:
  using In = std::conditional_t<cp, act::Rows, act::Full>;
  using Out = std::conditional_t<cp, act::RowsPartial, act::Partial>;
  using GradOut = In;
  using GradIn = Out;

  struct Ctx {
    typename Linear<T, ColumnParallel, epilogue::None, D>::Ctx qkv_ctx;
    typename Linear<T, RowParallel, epilogue::None, D>::Ctx proj_ctx;
    Tensor<T, act::Features, D> qkv;
    Allocation probs;                  // (B, H/tp, T, T); empty when the core is recomputed in backward
    Tensor<T, act::Features, D> core;  // context parallelism: y (B, T/c, C/tp), the attention's output
    Allocation lse;                    // context parallelism: (B, H/tp, T/c) in accumulate_t<T>
  };

  Linear<T, ColumnParallel, epilogue::None, D> qkv;
  Linear<T, RowParallel, epilogue::None, D> proj;
  std::int64_t heads = 0, head_dim = 0;

  CausalSelfAttention() = default;
  CausalSelfAttention(D& dev, std::int64_t C, std::int64_t H, const Spread& s, std::uint64_t id, std::uint64_t seed,
                      double std, double proj_std)
      : qkv(dev, C, 3 * C, s, id, seed, std), proj(dev, C, C, s, id + 2, seed, proj_std), heads(H), head_dim(C / H) {}

  std::int64_t local_heads() const { return qkv.out_local() / (3 * head_dim); }

 private:
  // GPT-2's positions are learned and added in the embedding: nothing turns the queries and keys.
  static constexpr auto no_rotation = [](T*, std::int64_t, std::int64_t, ops::Positions, int) {};
  Allocation probs_buffer(D& dev, std::int64_t B, std::int64_t Tn) const {
    return dev.allocate(B * local_heads() * Tn * Tn * static_cast<std::int64_t>(sizeof(T)), Category::activations);
  }

 public:
  Tensor<T, act::Partial, D> forward(Ctx& ctx, const Tensor<T, act::Full, D>& x)
    requires(!cp)
  {
    const std::int64_t B = x.local_shape()[0], Tn = x.local_shape()[1], Hl = local_heads();
    ctx.qkv = qkv.forward(ctx.qkv_ctx, x);
    Allocation probs = probs_buffer(x.dev(), B, Tn);
    auto y = Tensor<T, act::Features, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    ops::Attention<D>::forward(x.dev(), y.data(), static_cast<T*>(probs.data()), ctx.qkv.data(), B, Tn, Hl, head_dim);
    if (keep_probs) ctx.probs = std::move(probs);
    return proj.forward(ctx.proj_ctx, y);
  }

  // dy (B, T, C) Replicate -> dx (B, T, C) Partial.
  Tensor<T, act::Partial, D> backward(Ctx& ctx, const Tensor<T, act::Full, D>& dy)
    requires(!cp)
  {
    const std::int64_t B = dy.local_shape()[0], Tn = dy.local_shape()[1], Hl = local_heads();
    auto dcore = proj.backward(ctx.proj_ctx, dy);  // (B, T, C/tp) Shard<-1>
    if (!ctx.probs.data()) {                       // Selective recompute: rebuild the probabilities from the saved qkv
      ctx.probs = probs_buffer(dy.dev(), B, Tn);
      auto scratch =
          Tensor<T, act::Features, D>::empty(dy.dev(), dcore.global_shape(), dy.spread(), Category::activations);
      ops::Attention<D>::forward(dy.dev(), scratch.data(), static_cast<T*>(ctx.probs.data()), ctx.qkv.data(), B, Tn, Hl,
                                 head_dim);
    }
    auto dqkv =
        Tensor<T, act::Features, D>::empty(dy.dev(), ctx.qkv.global_shape(), dy.spread(), Category::activations);
    ops::Attention<D>::backward(dy.dev(), dqkv.data(), dcore.data(), ctx.qkv.data(),
                                static_cast<const T*>(ctx.probs.data()), B, Tn, Hl, head_dim);
    auto dx = qkv.backward(ctx.qkv_ctx, dqkv);
    ctx.qkv = {};  // the projections' contexts stay where their weight gradients are deferred
    ctx.probs.reset();
    return dx;
  }

  // Context parallelism: x (B, T, C) this rank's rows (nn/context_attention.hpp); out Partial over
  // tensor. Heads of (q, k, v) each: groups of one query.
  template <AxisComms M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh)
    requires cp
  {
    return detail::ContextAttention<Cx>::template forward<Out>(*this, ctx, x, mesh, local_heads(), head_dim, 1,
                                                               no_rotation, "CausalSelfAttention::forward");
  }
  template <AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh)
    requires cp
  {
    return detail::ContextAttention<Cx>::template backward<GradIn>(*this, ctx, dy, mesh, local_heads(), head_dim, 1,
                                                                   no_rotation, "CausalSelfAttention::backward");
  }

  // The deferred weight gradients of both projections (Linear::defer_weight).
  void backward_weight(Ctx& ctx) {
    qkv.backward_weight(ctx.qkv_ctx);
    proj.backward_weight(ctx.proj_ctx);
  }
  void defer_weight(bool on) {
    qkv.defer_weight(on);
    proj.defer_weight(on);
  }

  // describe's row (nn/plan_walk.hpp), with context parallelism: the keys and values of the rank's
  // rows over the context axis, Cx's way. act the global (B, T, C).
  void plan_rows(std::vector<PlanRow>& out, const std::string& row, const Shape& act, const Spread& s,
                 std::int64_t e) const
    requires cp
  {
    out.push_back(detail::ContextAttention<Cx>::template plan_row<T, CausalSelfAttention>(
        cat(row, " (", name(), ")"), act, s, e, heads / s.tensor_degree, head_dim));
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() {
    if constexpr (cp) return cat("CausalSelfAttention<context ", Cx::name, ">");
    else return "CausalSelfAttention";
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    qkv.for_each_param(prefix + ".qkv", f);
    proj.for_each_param(prefix + ".proj", f);
  }
};

// Mlp: ColumnParallel C -> 4C with fused GELU, RowParallel 4C -> C (out Partial).
template <Floating T, class D = Host>
class Mlp {
 public:
  using In = act::Full;
  using Out = act::Partial;
  using GradOut = act::Full;
  using GradIn = act::Partial;

  struct Ctx {
    typename Linear<T, ColumnParallel, epilogue::Gelu, D>::Ctx fc_ctx;
    typename Linear<T, RowParallel, epilogue::None, D>::Ctx proj_ctx;
  };

  Linear<T, ColumnParallel, epilogue::Gelu, D> fc;
  Linear<T, RowParallel, epilogue::None, D> proj;

  Mlp() = default;
  Mlp(D& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed, double std, double proj_std)
      : fc(dev, C, 4 * C, s, id, seed, std), proj(dev, 4 * C, C, s, id + 2, seed, proj_std) {}

  Tensor<T, act::Partial, D> forward(Ctx& ctx, const Tensor<T, act::Full, D>& x) {
    auto h = fc.forward(ctx.fc_ctx, x);  // (B, T, 4C/tp) Shard<-1>
    return proj.forward(ctx.proj_ctx, h);
  }
  Tensor<T, act::Partial, D> backward(Ctx& ctx, const Tensor<T, act::Full, D>& dy) {
    auto dh = proj.backward(ctx.proj_ctx, dy);
    return fc.backward(ctx.fc_ctx, dh);
  }
  void backward_weight(Ctx& ctx) {
    fc.backward_weight(ctx.fc_ctx);
    proj.backward_weight(ctx.proj_ctx);
  }
  void defer_weight(bool on) {
    fc.defer_weight(on);
    proj.defer_weight(on);
  }
  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Mlp"; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    fc.for_each_param(prefix + ".fc", f);
    proj.for_each_param(prefix + ".proj", f);
  }
};

}  // namespace weft::nn
